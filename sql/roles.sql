-- The role skippr reads with: it may log in, replicate, and read the sample tables.
-- Run as a superuser against the `app` database; psql variable `pw` holds the password:
--   psql -d app -v pw="$APP_DB_PASSWORD" -f sql/roles.sql

SELECT 'CREATE ROLE skippr_reader' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'skippr_reader')
\gexec
ALTER ROLE skippr_reader WITH LOGIN REPLICATION PASSWORD :'pw';
GRANT SELECT ON ALL TABLES IN SCHEMA public TO skippr_reader;
-- Creating the publication needs table ownership: create it here, as the owner.
DROP PUBLICATION IF EXISTS skippr_analytics_app;
CREATE PUBLICATION skippr_analytics_app FOR TABLE orders, customers;
