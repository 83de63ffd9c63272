"""The History screen's queries over several gateway replicas' stores read as one
(``tokenops dashboard --history-store a.duckdb --history-store b.duckdb``): the same named
queries the server's ``GET /admin/query/{name}`` runs, on the replicas' ``requests`` and
``image_requests`` rows merged by :func:`tokenops.store.merged_telemetry.merged_requests`
(a file a running server holds is read through its store channel)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenops.tui.client import AdminError


class MergedHistory:
    """Runs named queries on the merge of ``paths``; :meth:`queries` merges once for several."""

    def __init__(self, paths: Sequence[str]) -> None:
        assert paths
        self.paths = list(paths)

    @property
    def label(self) -> str:
        return f"{len(self.paths)} stores merged" if len(self.paths) > 1 else self.paths[0]

    def queries(self, names: Sequence[str], since: str = "7d") -> dict[str, dict[str, Any] | str]:
        """``{name: {"name", "columns", "rows"}}``; a name whose query failed maps to its message,
        and when the stores cannot be read every name does."""
        from tokenops.store import StoreError, parse_since
        from tokenops.store.merged_telemetry import merged_requests

        try:
            merged, _ = merged_requests(self.paths, parse_since(since), tables=("requests", "image_requests"))
        except StoreError as e:
            return dict.fromkeys(names, str(e))
        except Exception as e:  # a file that is not a store: say which, keep the dashboard up
            return dict.fromkeys(names, f"cannot read {', '.join(self.paths)}: {e}")
        out: dict[str, dict[str, Any] | str] = {}
        with merged:
            for name in names:
                try:
                    out[name] = {"name": name, **merged.run_query(name, since=since)}
                except StoreError as e:
                    out[name] = str(e)
        return out

    def query(self, name: str, **params: Any) -> dict[str, Any]:
        """One named query, as :meth:`tokenops.tui.client.AdminClient.query` answers it."""
        result = self.queries([name], since=str(params.get("since", "7d")))[name]
        if isinstance(result, str):
            raise AdminError(result)
        return result
