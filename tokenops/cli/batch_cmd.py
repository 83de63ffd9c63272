"""``tokenops batch``: submit a JSONL file to a running server's Batch API, follow it, download
its results (``submit FILE``, ``status ID``, ``download ID``, ``cancel ID``, ``list``).

Talks to ``/v1/files`` and ``/v1/batches`` with an API key (``--api-key``, ``TOKENOPS_API_KEY``
or ``OPENAI_API_KEY``; a server without keys takes any). The server: ``--url``, else this
folder's running server, else ``[gateway]`` host:port (as ``tokenops dashboard`` finds it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from tokenops.cli.options import ConfigOpt, JsonOpt
from tokenops.errors import UserError

batch_app = typer.Typer(help="OpenAI's Batch API on a running server: submit, follow, download.", no_args_is_help=True)
_FINAL = ("completed", "failed", "expired", "cancelled")

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="Server URL (default: this folder's server, else [gateway]).", envvar="TOKENOPS_URL"),
]
ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key", help="API key (TOKENOPS_API_KEY, OPENAI_API_KEY).", envvar=["TOKENOPS_API_KEY", "OPENAI_API_KEY"]
    ),
]
WaitOpt = Annotated[bool, typer.Option("--wait", help="Follow the batch (a progress bar) until it finishes.")]
TimeoutOpt = Annotated[float, typer.Option("--timeout", help="Seconds --wait follows the batch at most.")]


class BatchClient:
    """The Files and Batch APIs of one server (httpx; errors become one-line :class:`UserError`)."""

    def __init__(self, url: str | None, api_key: str | None, config: str | None, timeout_s: float = 600.0) -> None:
        import httpx

        from tokenops.cli.dashboard import resolve_connection

        base, _ = resolve_connection(url, None, config)
        # a keyless server takes any key; the header also lets a multipart upload past its browser guard
        self.http = httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {api_key or 'none'}"}, timeout=timeout_s
        )

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        import httpx

        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise UserError(
                f"{self.http.base_url}{path}: {e or type(e).__name__}; is `tokenops serve` running there?"
            ) from None
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except Exception:
                message = response.text[:300]
            raise UserError(f"{method} {path}: {response.status_code} {message}")
        return response

    def upload(self, path: Path) -> dict[str, Any]:
        with open(path, "rb") as f:
            files = {"file": (path.name, f, "application/jsonl")}
            return self._call("POST", "/v1/files", data={"purpose": "batch"}, files=files).json()

    def create(self, file_id: str, endpoint: str, window: str, metadata: dict[str, str] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": window}
        if metadata:
            body["metadata"] = metadata
        return self._call("POST", "/v1/batches", json=body).json()

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/batches/{batch_id}").json()

    def batches(self, limit: int) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/batches", params={"limit": limit}).json()["data"]

    def cancel(self, batch_id: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/batches/{batch_id}/cancel").json()

    def content(self, file_id: str) -> bytes:
        return self._call("GET", f"/v1/files/{file_id}/content").content

    def wait(self, batch_id: str, timeout_s: float, show: bool = True) -> dict[str, Any]:
        """Poll until the batch finishes; a rich progress bar of its lines meanwhile."""
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        deadline = time.monotonic() + timeout_s
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, disable=not show, transient=False) as progress:
            task = progress.add_task(batch_id, total=None)
            while True:
                batch = self.batch(batch_id)
                counts = batch["request_counts"]
                done = counts["completed"] + counts["failed"]
                progress.update(
                    task, total=counts["total"] or None, completed=done, description=f"{batch_id} {batch['status']}"
                )
                if batch["status"] in _FINAL:
                    return batch
                if time.monotonic() > deadline:
                    raise UserError(
                        f"batch {batch_id} is still {batch['status']} after {timeout_s:g} s ({done} of {counts['total']} lines)"
                    )
                time.sleep(0.5)


def _summary(batch: dict[str, Any]) -> str:
    c = batch["request_counts"]
    files = "".join(f" {k}={batch[k]}" for k in ("output_file_id", "error_file_id") if batch.get(k))
    return f"{batch['id']} {batch['status']}: {c['completed']} completed, {c['failed']} failed of {c['total']}{files}"


def _print(batch: dict[str, Any], as_json: bool) -> None:
    typer.echo(json.dumps(batch, indent=2) if as_json else _summary(batch))


@batch_app.command("submit")
def submit(
    file: Annotated[
        Path,
        typer.Argument(help="JSONL input: one {custom_id, method, url, body} per line.", exists=True, dir_okay=False),
    ],
    endpoint: Annotated[str, typer.Option("--endpoint", help="The lines' url.")] = "/v1/chat/completions",
    window: Annotated[str, typer.Option("--window", help="completion_window: 24h (or <N>h, <N>m, <N>s).")] = "24h",
    metadata: Annotated[list[str] | None, typer.Option("--metadata", help="KEY=VALUE, repeatable.")] = None,
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 86400.0,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Upload FILE and create a batch from it; --wait follows it to the end."""
    pairs = dict(item.split("=", 1) for item in metadata or () if "=" in item)
    client = BatchClient(url, api_key, config)
    uploaded = client.upload(file)
    batch = client.create(uploaded["id"], endpoint, window, pairs)
    if wait:
        batch = client.wait(batch["id"], timeout, show=not as_json)
    _print(batch, as_json)


@batch_app.command("status")
def status(
    batch_id: Annotated[str, typer.Argument(help="The batch id (batch_...).")],
    wait: WaitOpt = False,
    timeout: TimeoutOpt = 86400.0,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A batch's state and line counts; --wait follows it to the end."""
    client = BatchClient(url, api_key, config)
    _print(client.wait(batch_id, timeout, show=not as_json) if wait else client.batch(batch_id), as_json)


@batch_app.command("download")
def download(
    batch_id: Annotated[str, typer.Argument(help="The batch id (batch_...).")],
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Where the results go (default: BATCH_ID.jsonl).")
    ] = None,
    errors: Annotated[
        Path | None, typer.Option("--errors", help="Where failed lines go (default: BATCH_ID.errors.jsonl).")
    ] = None,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Write a finished batch's output (and error) file."""
    client = BatchClient(url, api_key, config)
    batch = client.batch(batch_id)
    if batch["status"] not in _FINAL:
        raise UserError(
            f"batch {batch_id} is {batch['status']}: download it once it finished (tokenops batch status {batch_id} --wait)"
        )
    written: dict[str, Any] = {}
    for key, path in (
        ("output_file_id", output or Path(f"{batch_id}.jsonl")),
        ("error_file_id", errors or Path(f"{batch_id}.errors.jsonl")),
    ):
        if batch.get(key):
            data = client.content(batch[key])
            path.write_bytes(data)
            written[str(path)] = data.count(b"\n")
    if as_json:
        typer.echo(json.dumps({"batch": batch["id"], "files": written}))
    else:
        for path_name, num in written.items() or [("(no files)", 0)]:
            typer.echo(f"{path_name}: {num} lines")


@batch_app.command("cancel")
def cancel(
    batch_id: Annotated[str, typer.Argument(help="The batch id (batch_...).")],
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a batch: it stops feeding lines and cancels those in flight."""
    _print(BatchClient(url, api_key, config).cancel(batch_id), as_json)


@batch_app.command("list")
def list_batches(
    limit: Annotated[int, typer.Option("--limit", help="At most this many, newest first.")] = 20,
    url: UrlOpt = None,
    api_key: ApiKeyOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """This key's batches, newest first."""
    found = BatchClient(url, api_key, config).batches(limit)
    typer.echo(json.dumps(found, indent=2) if as_json else "\n".join(_summary(b) for b in found) or "no batches")


def register(app: typer.Typer) -> None:
    app.add_typer(batch_app, name="batch")
