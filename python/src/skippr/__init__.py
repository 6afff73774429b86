"""Write and read ``skippr.yml``, the configuration of ``skipprd``, from Python.

The file :meth:`Config.save` writes is byte for byte what ``skipprd connect`` writes for the
same settings, and :meth:`Config.load` reads any valid ``skippr.yml`` back into the same
objects. Every setting is checked when it is given; a bad one raises :class:`ConfigError`
naming the field and what is allowed.

Example::

    from skippr import (Config, DataSinkAthenaIceberg, DataSourcePostgres,
                        DataSourcePostgresSourceCdcMode, EnvRef, LocalStorage, Pipeline)

    cfg = Config().workspace("analytics").storage(LocalStorage())
    app_db = cfg.data_source("app_db", DataSourcePostgres(
        host="db.internal", user="skippr_reader", password=EnvRef("APP_DB_PASSWORD"),
        database="app", tables=["orders", "customers"],
        cdc_mode=DataSourcePostgresSourceCdcMode.SNAPSHOTTHENCDC))
    lake = cfg.data_sink("lake", DataSinkAthenaIceberg(
        warehouse="s3://my-iceberg-warehouse/", glue_database_name="analytics",
        athena_workgroup_name="primary", athena_results_s3_bucket="my-athena-results",
        region="us-east-1"), schema_sink="lake_schema")
    cfg.pipeline("orders", Pipeline(data_source=app_db, data_sink=lake))
    cfg.save("skippr.yml")
"""

from typing import Optional

from ._config import Config
from ._errors import ConfigError
from ._model import (
    DataSinkAthenaIceberg,
    DataSinkDef,
    DataSinkGlueRestIceberg,
    DataSinkLocalIceberg,
    DataSinkRef,
    DataSinkRestIceberg,
    DataSinkRestIcebergSigv4,
    DataSinkS3TablesIceberg,
    DataSourcePostgres,
    DataSourcePostgresSourceCdcMode,
    DataSourcePostgresSourceSslMode,
    DataSourceRef,
    EnvRef,
    LocalStorage,
    S3Storage,
    MetricsSettings,
    LeaseSettings,
    ConsistentCuts,
    MaintenanceSettings,
    ReconnectSettings,
    Pipeline,
    PipelineTable,
    QuerySettings,
    QueryTls,
    QueryUser,
    SchemaSinkRef,
    SinkConnector,
    Text,
)



def _installed_version() -> str:
    # The wheel's version is the crate's (maturin reads Cargo.toml), so it is also the version
    # `skipprd --version` prints. A source tree used without installing has no metadata.
    from importlib import metadata

    try:
        return metadata.version("skipprd")
    except metadata.PackageNotFoundError:
        return "0+unknown"


__version__ = _installed_version()


def skipprd_path() -> Optional[str]:
    """The ``skipprd`` binary installed with this package, else the one on ``PATH``, else None."""
    import shutil
    import sysconfig

    scripts = sysconfig.get_path("scripts")
    beside = shutil.which("skipprd", path=scripts) if scripts else None
    return beside or shutil.which("skipprd")


__all__ = [
    "Config",
    "ConfigError",
    "DataSinkAthenaIceberg",
    "DataSinkDef",
    "DataSinkGlueRestIceberg",
    "DataSinkLocalIceberg",
    "DataSinkRef",
    "DataSinkRestIceberg",
    "DataSinkRestIcebergSigv4",
    "DataSinkS3TablesIceberg",
    "DataSourcePostgres",
    "DataSourcePostgresSourceCdcMode",
    "DataSourcePostgresSourceSslMode",
    "DataSourceRef",
    "EnvRef",
    "LocalStorage",
    "S3Storage",
    "MetricsSettings",
    "LeaseSettings",
    "ConsistentCuts",
    "MaintenanceSettings",
    "ReconnectSettings",
    "Pipeline",
    "PipelineTable",
    "QuerySettings",
    "QueryTls",
    "QueryUser",
    "SchemaSinkRef",
    "SinkConnector",
    "Text",
    "__version__",
    "skipprd_path",
]
