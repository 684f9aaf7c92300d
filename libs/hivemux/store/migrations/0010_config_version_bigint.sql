-- A cell configuration's version may be up to 10^10 (events.base.MAX_VERSION: `hivemux cells
-- configure` numbers versions by Unix time, past 2^31 in 2038). As int, a valid CellConfig past
-- 2^31 - 1 made every batch holding it fail, and the projector stopped on it after each restart.
ALTER TABLE vc_quotas ALTER COLUMN config_version TYPE bigint;
