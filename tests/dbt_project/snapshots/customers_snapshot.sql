{% snapshot customers_snapshot %}

{{
    config(
      target_schema=target.schema,
      unique_key='id',
      strategy='timestamp',
      updated_at='updated_at',
    )
}}

select id, name, region, updated_at from {{ source('app', 'customers') }}

{% endsnapshot %}
