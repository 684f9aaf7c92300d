-- Optional token expiry (hivemux.store.tokens, issue 28): `hivemux tokens create --ttl 12h`
-- sets expires_at = created_at + ttl (the database's clock, like created_at and revoked_at);
-- NULL never expires, so the tokens made before this migration keep working.
ALTER TABLE api_tokens ADD COLUMN expires_at timestamptz;
