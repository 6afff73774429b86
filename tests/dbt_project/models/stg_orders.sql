{{ config(materialized='view') }}

-- The orders that count: every order but the cancelled ones.
select
    id as order_id,
    customer_id,
    status,
    amount,
    ordered_at,
    updated_at
from {{ source('app', 'orders') }}
where status <> 'cancelled'
