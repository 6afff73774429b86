{{ config(materialized='table') }}

with customers as (
    select * from {{ source('app', 'customers') }}
),

orders as (
    select * from {{ ref('stg_orders') }}
)

select
    c.id as customer_id,
    c.name,
    c.region,
    r.region_name,
    count(o.order_id) as order_count,
    coalesce(sum(o.amount), 0) as revenue,
    max(o.ordered_at) as last_ordered_at
from customers c
left join orders o on o.customer_id = c.id
left join {{ ref('regions') }} r on r.region_code = c.region
group by c.id, c.name, c.region, r.region_name
