"""The "Delta Mirror" page's FastAPI app: its routes and who may see what.

Airflow 3 does not authenticate plugin apps: every route here, the OpenAPI schema and the docs
included, depends on Airflow's ``get_user`` (a JWT in ``Authorization: Bearer`` or the UI's session
cookie): anonymous requests get 401. What a user then sees follows the tables' own DAGs:

- a table in the table config is visible to whoever may read its DAG (``delta_mirror__<name>``, the
  id the DAG factory gives it: ``TableConfig.dag_id``), as the auth manager decides for that DAG;
- a table in the store without a config entry has no DAG: it is visible by the Airflow setting
  ``[delta_mirror] tables_without_dag`` (``AIRFLOW__DELTA_MIRROR__TABLES_WITHOUT_DAG``):
  ``configuration`` (the default: who may read Airflow's configuration, Admin and Op with the FAB
  auth manager), ``authenticated`` (every logged-in user) or ``nobody``.

Nothing is read from the query string (Airflow's ``requires_access_dag`` takes ``?dag_id=``, which
let a user of one DAG read every table). The overview and the health verdict cover only the
tables the user may read; a table page the user may not read is the one 403 (``FORBIDDEN``), the
same text for every name, also for a name that does not exist, unless the user may read tables
without a DAG: then a configured table it may not read is the same 404 as an unknown name. No
answer tells a configured name from any other.

The pages' data is ``delta_mirror.health.pages`` (one ``PageStores`` for the server's life, store
connections read through ``DeltaMirrorHook``); their HTML is ``ui_render``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import DagDetails
from airflow.api_fastapi.core_api.security import GetUserDep, get_user
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from delta_mirror.airflow import ui_render
from delta_mirror.health import pages
from delta_mirror.health.pages import OVERVIEW_PAGE, TABLE_VERSIONS, PageStores

log = logging.getLogger(__name__)

#: The Airflow config section and option of the tables without a DAG.
SECTION, OPTION = "delta_mirror", "tables_without_dag"
TABLES_WITHOUT_DAG = ("configuration", "authenticated", "nobody")
DEFAULT_TABLES_WITHOUT_DAG = "configuration"


class SettingError(ValueError):
    """``[delta_mirror] tables_without_dag`` holds a value this version does not know."""


def tables_without_dag_setting(value: str | None = None) -> str:
    """The setting (read from Airflow's config at each request: no restart needed)."""
    if value is None:
        from airflow.configuration import conf

        value = conf.get(SECTION, OPTION, fallback=DEFAULT_TABLES_WITHOUT_DAG)
    choice = (value or DEFAULT_TABLES_WITHOUT_DAG).strip().lower()
    if choice not in TABLES_WITHOUT_DAG:
        raise SettingError(
            f"[{SECTION}] {OPTION} (AIRFLOW__{SECTION.upper()}__{OPTION.upper()}) is {value!r}: "
            f"use one of {', '.join(TABLES_WITHOUT_DAG)}"
        )
    return choice


class TableAccess:
    """What one user may read, asked of Airflow's auth manager once per request and DAG."""

    def __init__(self, user: Any, config: Any, auth_manager: Any, without_dag: str | None = None) -> None:
        self.user = user
        self.auth = auth_manager
        self.dag_of: dict[str, str] = {n: t.dag_id for n, t in config.tables.items()} if config else {}
        self._without_dag_setting = without_dag
        self._readable_dags: set[str] | None = None
        self._without_dag: bool | None = None

    def dag_id(self, name: str) -> str | None:
        """The table's DAG (from the table config, as the DAG factory names it), or ``None``."""
        return self.dag_of.get(name)

    def readable_dags(self) -> set[str]:
        """The configured tables' DAGs this user may read: one batch question to the auth manager."""
        if self._readable_dags is None:
            self._readable_dags = set(
                self.auth.filter_authorized_dag_ids(
                    dag_ids=set(self.dag_of.values()), user=self.user, method="GET"
                )
            )
        return self._readable_dags

    def may_read_tables_without_dag(self) -> bool:
        if self._without_dag is None:
            setting = tables_without_dag_setting(self._without_dag_setting)
            if setting == "authenticated":
                self._without_dag = True
            elif setting == "configuration":
                self._without_dag = bool(self.auth.is_authorized_configuration(method="GET", user=self.user))
            else:
                self._without_dag = False
        return self._without_dag

    def may_read(self, name: str) -> bool:
        """One table (a table page): the auth manager asked about its DAG alone."""
        dag_id = self.dag_id(name)
        if dag_id is None:
            return self.may_read_tables_without_dag()
        if self._readable_dags is not None:
            return dag_id in self._readable_dags
        return bool(self.auth.is_authorized_dag(method="GET", details=DagDetails(id=dag_id), user=self.user))

    def visible(self, name: str) -> bool:
        """Many tables (the overview, health): every configured DAG asked about in one batch."""
        dag_id = self.dag_id(name)
        return self.may_read_tables_without_dag() if dag_id is None else dag_id in self.readable_dags()


def _connection_url(conn_id: str) -> str | None:
    """A table config's ``store_conn_id``: the store's URL from that Airflow connection."""
    from delta_mirror.airflow.hooks import DeltaMirrorHook

    return DeltaMirrorHook(store_conn_id=conn_id).store_url


#: The stores the pages read: one engine and pool per store connection for the server's life.
STORES = PageStores(_connection_url)


def _access() -> Any:
    """The dependency that makes a request's ``TableAccess`` (the table config read per request)."""

    def access(user: GetUserDep) -> TableAccess:
        from delta_mirror.errors import MirrorError

        try:
            return TableAccess(user, pages.page_config(), get_auth_manager())
        except MirrorError as exc:  # a broken table config: one line, not a stack trace
            raise HTTPException(status_code=503, detail=exc.message) from None

    return Depends(access)


def _without_dag_links(rows: list[dict[str, Any]], access: TableAccess) -> None:
    """A table without a config entry has no DAG: no ``dag_id`` (the page shows no dead link)."""
    for row in rows:
        if access.dag_id(row["table"]) is None:
            row["dag_id"] = None


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """The data functions' errors as HTTP answers: one line each."""
    from delta_mirror.errors import MirrorError, TableNotFoundError

    try:
        return fn(*args, **kwargs)
    except TableNotFoundError as exc:
        raise HTTPException(status_code=404, detail=exc.message) from None
    except MirrorError as exc:
        raise HTTPException(status_code=503, detail=exc.message) from None
    except SettingError as exc:
        log.error("%s", exc)
        raise HTTPException(status_code=500, detail=str(exc)) from None


#: The one refusal of a table page, whatever the name: configured or not, in the store or not.
FORBIDDEN = (
    f"you may not read this table: a table needs read access to its DAG, a table without one the"
    f" [{SECTION}] {OPTION} permission; or there is no table of that name"
)


def _not_found(name: str) -> HTTPException:
    """The one 404 of a name the user may not read or that no table has (they must look the same)."""
    return HTTPException(status_code=404, detail=f"no table named {name!r} that you may read")


def _check(access: TableAccess, name: str) -> None:
    """Refuse unless the user may read the table's own DAG (or, without one, by the setting).

    The answer never tells a configured name from any other: a user who may not read tables
    without a DAG gets the one 403 for every name it may not read (an unknown name included); a
    user who may gets for a configured table it may not read the 404 of an unknown name."""
    if not _call(access.may_read, name):
        if access.dag_id(name) is not None and access.may_read_tables_without_dag():
            raise _not_found(name)
        raise HTTPException(status_code=403, detail=FORBIDDEN)


def _table_data(stores: PageStores, access: TableAccess, name: str, window: str, versions: int) -> Any:
    """``pages.table_data`` for a name the user may read; an unconfigured name the store lacks is the
    404 of ``_not_found`` (a configured one keeps the table config's own line: its reader may know)."""
    try:
        return _call(pages.table_data, stores, name, window, versions)
    except HTTPException as exc:
        if exc.status_code == 404 and access.dag_id(name) is None:
            raise _not_found(name) from None
        raise


def _error_page(exc: HTTPException) -> HTMLResponse:
    """A table page's refusal as a page (it shows inside Airflow's iframe), not raw JSON."""
    title = {403: "Not allowed", 404: "No such table"}.get(exc.status_code, "Delta Mirror")
    return HTMLResponse(ui_render.error_html(title, exc.detail), status_code=exc.status_code)


def _add_table_routes(app: FastAPI, stores: PageStores) -> None:
    """The pages and the JSON API over ``stores``."""
    access_dep = _access()

    @app.get("/", response_class=HTMLResponse)
    def overview_page(page: int = 1, per_page: int = OVERVIEW_PAGE, access: TableAccess = access_dep) -> str:
        data = _call(pages.overview_data, stores, page, per_page, visible=access.visible)
        _without_dag_links(data["tables"], access)
        return ui_render.overview_html(data)

    @app.get("/tables/{name}", response_class=HTMLResponse, response_model=None)
    def table_page(
        name: str, window: str = "24h", versions: int = TABLE_VERSIONS, access: TableAccess = access_dep
    ) -> str | HTMLResponse:
        try:
            _check(access, name)
            data = _table_data(stores, access, name, window, versions)
        except HTTPException as exc:
            return _error_page(exc)
        _without_dag_links([data], access)
        return ui_render.table_html(data)

    @app.get("/api/overview")
    def overview_api(
        page: int = 1, per_page: int = OVERVIEW_PAGE, access: TableAccess = access_dep
    ) -> dict[str, Any]:
        data: dict[str, Any] = _call(pages.overview_data, stores, page, per_page, visible=access.visible)
        _without_dag_links(data["tables"], access)
        return data

    @app.get("/api/tables/{name}")
    def table_api(
        name: str, window: str = "24h", versions: int = TABLE_VERSIONS, access: TableAccess = access_dep
    ) -> dict[str, Any]:
        _check(access, name)
        data: dict[str, Any] = _table_data(stores, access, name, window, versions)
        _without_dag_links([data], access)
        return data

    @app.get("/api/health", response_model=None)
    def health_api(access: TableAccess = access_dep) -> JSONResponse:
        data = _call(pages.health_data, stores, visible=access.visible)
        return JSONResponse(data, status_code=200 if data["healthy"] else 503)


def _add_docs_routes(app: FastAPI) -> None:
    """The schema and its two viewers, behind the app's login (FastAPI's own ignore the app's
    dependencies). The viewers load their scripts from FastAPI's default CDN."""

    @app.get("/openapi.json", include_in_schema=False, response_model=None)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, response_model=None)
    def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=_schema_url(request), title="Delta Mirror - API")

    @app.get("/redoc", include_in_schema=False, response_model=None)
    def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(openapi_url=_schema_url(request), title="Delta Mirror - API")


def create_app(stores: PageStores | None = None) -> FastAPI:
    """The app Airflow's API server mounts at ``/delta-mirror`` (``ui_plugin.DeltaMirrorPlugin``),
    reading ``stores`` (the server's ``STORES`` unless given)."""
    app = FastAPI(
        title="Delta Mirror",
        description="Mirror status, lag history and health of the Delta Mirror tables. "
        "A table is visible to the users who may read its DAG.",
        dependencies=[Depends(get_user)],  # every route, the schema and the docs: 401 without a login
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    _add_table_routes(app, STORES if stores is None else stores)
    _add_docs_routes(app)
    return app


def _schema_url(request: Request) -> str:
    """``/delta-mirror/openapi.json`` where Airflow mounts the app (its root path)."""
    return f"{request.scope.get('root_path', '').rstrip('/')}/openapi.json"


__all__ = [
    "DEFAULT_TABLES_WITHOUT_DAG",
    "STORES",
    "TABLES_WITHOUT_DAG",
    "SettingError",
    "TableAccess",
    "create_app",
    "tables_without_dag_setting",
]
