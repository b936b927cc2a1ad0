-- The language and number format a device reads its notifications in: a BCP 47 tag such as
-- `ja-JP`, which the browser client sends at registration (the api checks its shape). NULL, as
-- for every device registered before, reads English with `1,234.56`.

ALTER TABLE devices ADD COLUMN locale text;

-- The dispatcher renders each notification for its device.
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'tidings_dispatcher') THEN
        GRANT SELECT (locale) ON devices TO tidings_dispatcher;
    END IF;
END
$$;
