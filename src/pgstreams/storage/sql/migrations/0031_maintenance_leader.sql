-- The maintenance leader as a lease, for clients behind a transaction pooler (connect(pooler="transaction")):
-- there a session advisory lock would stay with a server session that serves other clients once the
-- leader's transaction ended, and no client could tell who holds it. The leader renews its lease at every
-- tick of its maintenance service; a leader that stops renewing (its process died) loses it once
-- leader_until passes, and the next service to try takes it over. Clients straight to the server (or
-- behind a session pooler) keep leading by the session advisory lock 'pgstreams.maintenance-leader'.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.maintenance
    ADD COLUMN leader       text,
    ADD COLUMN leader_since timestamptz,
    ADD COLUMN leader_until timestamptz;
