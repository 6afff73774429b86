{{ config(materialized='incremental', incremental_strategy='delete+insert', unique_key='order_id') }}

-- The latest version of each order: a run replaces the orders changed since the last.
select order_id, customer_id, status, amount, amount * 2 as amount_doubled, updated_at
from {{ ref('stg_orders') }}
{% if is_incremental() %}
where updated_at > (select max(updated_at) from {{ this }})
{% endif %}
