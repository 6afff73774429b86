-- Sample data for the quickstart: an `app` database with customers and their orders.
SET client_min_messages = warning;
-- Run as a superuser against the `app` database: psql -d app -f sql/sample.sql

DROP TABLE IF EXISTS orders;
DROP TABLE IF EXISTS customers;
DROP TYPE IF EXISTS order_status;

CREATE TYPE order_status AS ENUM ('pending', 'paid', 'shipped', 'cancelled');

CREATE TABLE customers (
    id          bigint PRIMARY KEY,
    name        text NOT NULL,
    email       varchar(200),
    country     char(2),
    signed_up   timestamptz NOT NULL,
    tags        text[]
);

CREATE TABLE orders (
    id           bigint PRIMARY KEY,
    customer_id  bigint NOT NULL REFERENCES customers (id),
    status       order_status NOT NULL,
    amount       numeric(12, 2) NOT NULL,
    ordered_at   timestamptz NOT NULL,
    ship_by      date,
    external_ref uuid,
    details      jsonb
);

INSERT INTO customers
SELECT i,
       'customer ' || i,
       'customer' || i || '@example.com',
       (ARRAY['DE', 'FR', 'US', 'JP', 'BR'])[1 + i % 5],
       timestamptz '2024-01-01 00:00:00+00' + i * interval '37 minutes',
       CASE WHEN i % 3 = 0 THEN ARRAY['vip'] ELSE ARRAY[]::text[] END
FROM generate_series(1, 1000) AS i;

INSERT INTO orders
SELECT i,
       1 + (i * 7919) % 1000,
       (ARRAY['pending', 'paid', 'shipped', 'cancelled'])[1 + i % 4]::order_status,
       round((((i::bigint * 104729) % 100000) / 100.0)::numeric, 2),
       timestamptz '2024-06-01 00:00:00+00' + i * interval '11 minutes',
       date '2024-06-05' + (i % 30),
       md5(i::text)::uuid,
       jsonb_build_object('items', 1 + i % 5, 'gift', i % 10 = 0)
FROM generate_series(1, 50000) AS i;

ANALYZE customers;
ANALYZE orders;
