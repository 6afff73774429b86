-- Singular test: no customer has negative revenue.
select customer_id, revenue
from {{ ref('customer_revenue') }}
where revenue < 0
