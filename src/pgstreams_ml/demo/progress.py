"""The demo's progress bars (rich): the simulator, each pipeline, the scorers, monitoring and the phase,
refreshed by every wait of the orchestration."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

if TYPE_CHECKING:
    from .runner import Demo


class DemoProgress:
    """The progress bars of ``demo`` (:attr:`bars`, a :class:`rich.progress.Progress` to enter while the
    demo runs; off when ``demo.opts.progress`` is false); :meth:`tick` refreshes them."""

    def __init__(self, demo: Demo) -> None:
        opts = demo.opts
        self.demo = demo
        self.bars = progress = Progress(
            TextColumn("{task.description:<34}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=demo.console,
            disable=not opts.progress,
            transient=False,
        )
        self.tasks: dict[str, Any] = {
            "sim": progress.add_task("simulator (simulated time)", total=opts.duration, info=""),
            "clean": progress.add_task("clean pipeline (raw records)", total=1, info=""),
            "join": progress.add_task("join pipeline (examples)", total=1, info=""),
            "score": progress.add_task("scoring workers (impressions)", total=1, info=""),
            "monitor": progress.add_task(
                "monitoring (windows)", total=opts.duration / opts.window_seconds, info=""
            ),
            "phase": progress.add_task("phase", total=None, info=""),
        }

    def tick(self) -> None:
        """Refresh every bar from the demo's state, its groups' lag and the application's tables. Once the
        pipelines are drained (phase ``summary``), every bar ends at 100 %: what it counts is done (the
        counts stay in its text; not every raw record becomes an example or a prediction)."""
        self._tick()
        if self.demo.state.phase == "summary":
            for name, task_id in self.tasks.items():
                if name != "phase":
                    task = next(t for t in self.bars.tasks if t.id == task_id)
                    done = max(task.completed, 1)
                    self.bars.update(task_id, total=done, completed=done)

    def _tick(self) -> None:
        demo, progress, tasks = self.demo, self.bars, self.tasks
        s = demo.sim.stats
        progress.update(
            tasks["sim"],
            completed=s.sim_seconds,
            info=f"{s.raw_records:,} raw, {s.updates:,} updates" + (" [paused]" if s.paused else ""),
        )
        lag = demo.lag(demo.topo.clean_group)
        done = s.raw_records - lag if lag is not None else _query_rows(demo, "clean")
        progress.update(
            tasks["clean"],
            total=max(1, s.raw_records),
            completed=min(done, s.raw_records),
            info=f"lag {lag if lag is not None else '?'}",
        )
        n_ex = demo.scalar("count_examples") or 0
        progress.update(
            tasks["join"],
            total=max(1, s.impressions),
            completed=min(n_ex, s.impressions),
            info=f"{n_ex:,} examples",
        )
        if demo.serving is None:
            scored = sum(sc.counts["scored"] for sc in demo.scorers)
            skipped = sum(sc.counts["no_model"] for sc in demo.scorers)
            progress.update(
                tasks["score"],
                total=max(1, s.impressions),
                completed=min(scored + skipped, s.impressions),
                info=f"{scored:,} scored, {skipped:,} before a model",
            )
        else:  # the scorers run in processes of their own: the predictions they published
            predicted = demo.client.describe_topic(demo.topo.predictions_topic).events
            progress.update(
                tasks["score"],
                total=max(1, s.impressions),
                completed=min(predicted, s.impressions),
                info=f"{predicted:,} predictions, lag {demo.lag(demo.topo.scorer_group)}",
            )
        wins = demo.scalar("count_complete_windows") or 0
        flagged = demo.scalar("count_degraded") or 0
        progress.update(tasks["monitor"], completed=wins, info=f"{flagged} flagged degraded")
        progress.update(
            tasks["phase"],
            description=f"phase: {demo.state.phase}"[:34],
            info=", ".join(
                f"{m['label']}: model {m['model_id']} {'deployed' if m['promoted'] else 'rejected'}"
                for m in demo.state.models
            ),
        )


def _query_rows(demo: Demo, name: str) -> int:
    q = demo.queries.get(name)
    if q is None:
        st = demo.serving.status() if demo.serving is not None and name == "clean" else None
        return st.rows if st is not None else 0
    return sum(int(p.get("numInputRows", 0)) for p in q.recentProgress)
