{{ config(materialized='incremental', incremental_strategy='append') }}

-- Every version of every order seen so far: a run appends the orders changed since the last.
select order_id, customer_id, status, amount, updated_at
from {{ ref('stg_orders') }}
{% if is_incremental() %}
where updated_at > (select max(updated_at) from {{ this }})
{% endif %}
