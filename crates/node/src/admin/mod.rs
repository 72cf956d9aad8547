//! The admin API: HTTP/JSON on `<data>/admin.sock`, a Unix socket only the data directory's
//! owner can open (mode 0600). Restoring or exporting the past of a volume is as powerful as
//! reading and writing it, so there is no TCP listener (DESIGN.md "Security defaults").
//!
//! | method | path                          | body                 | answer            |
//! |--------|-------------------------------|----------------------|-------------------|
//! | GET    | /v1/volumes                   |                      | [VolumeInfo]      |
//! | POST   | /v1/volumes                   | {name, size_bytes}   | VolumeInfo        |
//! | GET    | /v1/volumes/{name}            |                      | VolumeInfo        |
//! | DELETE | /v1/volumes/{name}            |                      | {}                |
//! | POST   | /v1/volumes/{name}/grow       | {size_bytes}         | VolumeInfo        |
//! | POST   | /v1/volumes/{name}/read-only  | {read_only}          | VolumeInfo        |
//! | POST   | /v1/volumes/{name}/snapshots  | {at, scratch?, name?}| SnapshotInfo      |
//! | GET    | /v1/snapshots                 |                      | [SnapshotInfo]    |
//! | GET    | /v1/snapshots/{export}        |                      | SnapshotInfo      |
//! | DELETE | /v1/snapshots/{export}        |                      | {}                |
//! | POST   | /v1/volumes/{name}/marks      | {name, at?}          | MarkInfo          |
//! | GET    | /v1/volumes/{name}/marks      |                      | [MarkInfo]        |
//! | DELETE | /v1/volumes/{name}/marks/{m}  |                      | {}                |
//! | GET    | /v1/volumes/{name}/instant    | ?at=TIME             | the instant       |
//! | GET    | /v1/volumes/{name}/diff       | ?from=T1&to=T2       | DiffInfo          |
//! | GET    | /v1/volumes/{name}/activity   | ?from&to&buckets     | ActivityInfo      |
//! | POST   | /v1/volumes/{name}/rollback   | {to, force?}         | RollbackInfo (202)|
//! | GET    | /v1/volumes/{name}/rollback   |                      | RollbackInfo      |
//! | GET    | /v1/status                    |                      | status object     |
//! | GET    | /metrics                      |                      | Prometheus text   |
//!
//! Errors answer `{"error": "..."}` with 400 (bad request), 404 (no such volume), 409 (exists,
//! or busy) or 500.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::json;

use crate::{Node, NodeError};

mod history;

#[derive(Debug, Deserialize)]
struct CreateVolume {
    name: String,
    size_bytes: u64,
    /// Logical block size; the server's `volume.block_size` when absent.
    #[serde(default)]
    block_size: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct GrowVolume {
    size_bytes: u64,
}

#[derive(Debug, Deserialize)]
struct SetReadOnly {
    read_only: bool,
}

struct ApiError(NodeError);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match &self.0 {
            NodeError::NotFound(_) => StatusCode::NOT_FOUND,
            NodeError::Exists(_) | NodeError::Busy(_) => StatusCode::CONFLICT,
            NodeError::BadRequest(_) | NodeError::Config(_) => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({ "error": self.0.to_string() }))).into_response()
    }
}

type ApiResult = Result<Response, ApiError>;

/// A JSON body, with malformed bodies answered in the API's own error format.
fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    b.map(|Json(t)| t)
        .map_err(|e| ApiError(NodeError::BadRequest(e.body_text())))
}

/// A volume name from the URL, checked like names on create.
fn name_arg(name: String) -> Result<String, ApiError> {
    if crate::valid_volume_name(&name) {
        Ok(name)
    } else {
        Err(ApiError(NodeError::BadRequest(format!(
            "invalid volume name {name:?}"
        ))))
    }
}

/// Runs a blocking node operation off the async threads.
async fn blocking<T, F>(node: Arc<Node>, f: F) -> Result<T, ApiError>
where
    F: FnOnce(&Node) -> Result<T, NodeError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(move || f(&node))
        .await
        .map_err(|e| ApiError(NodeError::Io(e.to_string())))?
        .map_err(ApiError)
}

async fn list(State(node): State<Arc<Node>>) -> ApiResult {
    let infos = blocking(node, |n| {
        Ok(n.volume_names()
            .iter()
            .filter_map(|v| n.volume_info(v))
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(Json(infos).into_response())
}

async fn create(
    State(node): State<Arc<Node>>,
    req: Result<Json<CreateVolume>, JsonRejection>,
) -> ApiResult {
    let req = body(req)?;
    let info = blocking(node, move |n| {
        n.create_volume(&req.name, req.size_bytes, req.block_size)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

async fn info(State(node): State<Arc<Node>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    let name = name_arg(name)?;
    let info = blocking(node, move |n| {
        n.volume_info(&name).ok_or(NodeError::NotFound(name))
    })
    .await?;
    Ok(Json(info).into_response())
}

async fn delete(State(node): State<Arc<Node>>, UrlPath(name): UrlPath<String>) -> ApiResult {
    let name = name_arg(name)?;
    blocking(node, move |n| n.delete_volume(&name)).await?;
    Ok(Json(json!({})).into_response())
}

async fn grow(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    req: Result<Json<GrowVolume>, JsonRejection>,
) -> ApiResult {
    let name = name_arg(name)?;
    let req = body(req)?;
    let info = blocking(node, move |n| n.grow_volume(&name, req.size_bytes)).await?;
    Ok(Json(info).into_response())
}

async fn set_read_only(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    req: Result<Json<SetReadOnly>, JsonRejection>,
) -> ApiResult {
    let name = name_arg(name)?;
    let req = body(req)?;
    let info = blocking(node, move |n| n.set_read_only(&name, req.read_only)).await?;
    Ok(Json(info).into_response())
}

async fn status(State(node): State<Arc<Node>>) -> ApiResult {
    let sb = *node.log().superblock();
    let body = json!({
        "data": node.data_dir(),
        "recovery": node.recovery,
        "log": {
            "log_id": format!("{:032x}", sb.log_id),
            "devices": sb.device_count,
            "segment_bytes": sb.segment_bytes,
            "segments_per_device": sb.segment_count,
            "failed": node.log().failure(),
        },
        "store": { "failed": node.store().failure(), "progress_seq": node.store().progress().applied_seq },
        "volumes": node.volume_names(),
        "history": history_status(&node),
    });
    Ok(Json(body).into_response())
}

/// History in `mariner status`: the configured window, and each volume's effective one.
fn history_status(node: &Node) -> serde_json::Value {
    let Some(h) = node.history() else {
        return json!({ "enabled": false });
    };
    let volumes: serde_json::Map<String, serde_json::Value> = node
        .volume_names()
        .into_iter()
        .filter_map(|n| {
            let info = node.volume_info(&n)?.history?;
            Some((n, serde_json::to_value(info).ok()?))
        })
        .collect();
    let s = h.stats();
    json!({
        "enabled": true,
        "configured_window_s": h.configured_window().as_secs_f64(),
        "failed": h.failure(),
        "shrinks": s.shrinks.load(std::sync::atomic::Ordering::Relaxed),
        "cuts": s.cuts.load(std::sync::atomic::Ordering::Relaxed),
        "volumes": volumes,
    })
}

/// Rendered off the async threads: some figures take a component's lock (history's index
/// router, held through an index batch's log write), and a scrape waiting there on a runtime
/// worker would stall the volumes' I/O on that worker.
async fn metrics(State(node): State<Arc<Node>>) -> Response {
    match tokio::task::spawn_blocking(move || crate::metrics::render(&node)).await {
        Ok(body) => ([("content-type", "text/plain; version=0.0.4")], body).into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("rendering the metrics failed: {e}\n"),
        )
            .into_response(),
    }
}

async fn not_found() -> Response {
    let body = Json(json!({ "error": "no such endpoint; see docs/ARCHITECTURE.md" }));
    (StatusCode::NOT_FOUND, body).into_response()
}

pub fn router(node: Arc<Node>) -> Router {
    Router::new()
        .route("/v1/volumes", get(list).post(create))
        .route("/v1/volumes/{name}", get(info).delete(delete))
        .route("/v1/volumes/{name}/grow", post(grow))
        .route("/v1/volumes/{name}/read-only", post(set_read_only))
        .route(
            "/v1/volumes/{name}/snapshots",
            post(history::export_snapshot),
        )
        .route("/v1/snapshots", get(history::list_snapshots))
        .route(
            "/v1/snapshots/{export}",
            get(history::snapshot_info).delete(history::remove_snapshot),
        )
        .route(
            "/v1/volumes/{name}/marks",
            get(history::list_marks).post(history::set_mark),
        )
        .route(
            "/v1/volumes/{name}/marks/{mark}",
            axum::routing::delete(history::remove_mark),
        )
        .route("/v1/volumes/{name}/instant", get(history::instant))
        .route("/v1/volumes/{name}/diff", get(history::diff))
        .route("/v1/volumes/{name}/activity", get(history::activity))
        .route(
            "/v1/volumes/{name}/rollback",
            get(history::rollback_status).post(history::start_rollback),
        )
        .route("/v1/status", get(status))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(node)
}

/// Binds `<data>/admin.sock` with mode 0600 without a window in which others could connect: the
/// socket is made in a private (0700) directory, restricted, then renamed into place.
pub fn bind(data: &Path) -> std::io::Result<(tokio::net::UnixListener, PathBuf)> {
    let path = data.join("admin.sock");
    let private = data.join(".admin-bind");
    let _ = std::fs::remove_dir_all(&private);
    std::fs::create_dir(&private)?;
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700))?;
    let tmp = private.join("admin.sock");
    let listener = tokio::net::UnixListener::bind(&tmp)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))?;
    let _ = std::fs::remove_file(&path); // stale socket: we hold the data directory's lock
    std::fs::rename(&tmp, &path)?;
    std::fs::remove_dir(&private)?;
    Ok((listener, path))
}
