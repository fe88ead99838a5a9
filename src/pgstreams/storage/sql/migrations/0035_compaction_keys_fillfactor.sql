-- Compaction's key map (0033_compaction.sql) is updated once per key and mapping step: a key's entry moves
-- forward to the position of its latest event. With pages full (fillfactor 100) each update writes the new
-- version to another page and leaves a dead tuple for VACUUM; with room left on every page the update stays
-- on its page (a heap-only tuple, position being in no index) and the next update of the page prunes the
-- old version without VACUUM. Rows inserted from now on leave that room.
--
-- Rendered with the target schema as {schema} / '{schema_raw}'; literal braces are doubled.

ALTER TABLE {schema}.compaction_keys SET (fillfactor = 50);
