//! The admin API's history routes: snapshot exports, bookmarks, instants, diff, activity and
//! rollback (see the table in `super`).

use std::sync::Arc;

use axum::extract::rejection::JsonRejection;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::{blocking, body, name_arg, ApiResult};
use crate::history::instant::format_ns;
use crate::Node;

#[derive(Debug, Deserialize)]
pub(super) struct ExportSnapshot {
    /// TIME (docs/ARCHITECTURE.md "History", "What the user gets").
    at: String,
    #[serde(default)]
    scratch: bool,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct SetMark {
    name: String,
    #[serde(default)]
    at: Option<String>,
}

#[derive(Debug, Deserialize)]
pub(super) struct AtQuery {
    at: String,
}

pub(super) async fn export_snapshot(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    req: Result<Json<ExportSnapshot>, JsonRejection>,
) -> ApiResult {
    let name = name_arg(name)?;
    let req = body(req)?;
    let info = blocking(node, move |n| {
        n.export_snapshot(&name, &req.at, req.scratch, req.name.as_deref())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

pub(super) async fn list_snapshots(State(node): State<Arc<Node>>) -> ApiResult {
    let infos = blocking(node, |n| Ok(n.snapshot_infos())).await?;
    Ok(Json(infos).into_response())
}

pub(super) async fn snapshot_info(
    State(node): State<Arc<Node>>,
    UrlPath(export): UrlPath<String>,
) -> ApiResult {
    let info = blocking(node, move |n| {
        n.snapshot_info(&export)
            .ok_or_else(|| crate::NodeError::NotFound(format!("snapshot export {export}")))
    })
    .await?;
    Ok(Json(info).into_response())
}

pub(super) async fn remove_snapshot(
    State(node): State<Arc<Node>>,
    UrlPath(export): UrlPath<String>,
) -> ApiResult {
    blocking(node, move |n| n.remove_snapshot(&export)).await?;
    Ok(Json(json!({})).into_response())
}

pub(super) async fn set_mark(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    req: Result<Json<SetMark>, JsonRejection>,
) -> ApiResult {
    let name = name_arg(name)?;
    let req = body(req)?;
    let info = blocking(node, move |n| n.mark(&name, &req.name, req.at.as_deref())).await?;
    Ok((StatusCode::CREATED, Json(info)).into_response())
}

pub(super) async fn list_marks(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult {
    let name = name_arg(name)?;
    let marks = blocking(node, move |n| n.marks(&name)).await?;
    Ok(Json(marks).into_response())
}

pub(super) async fn remove_mark(
    State(node): State<Arc<Node>>,
    UrlPath((name, mark)): UrlPath<(String, String)>,
) -> ApiResult {
    let name = name_arg(name)?;
    blocking(node, move |n| n.unmark(&name, &mark)).await?;
    Ok(Json(json!({})).into_response())
}

/// What TIME means for a volume now: `GET /v1/volumes/{name}/instant?at=TIME`.
pub(super) async fn instant(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<AtQuery>,
) -> ApiResult {
    let name = name_arg(name)?;
    let p = blocking(node, move |n| n.resolve_instant(&name, &q.at)).await?;
    Ok(Json(json!({
        "volume_seq": p.volume_seq,
        "timestamp_ns": p.timestamp_ns,
        "time": format_ns(p.timestamp_ns),
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct SpanQuery {
    from: Option<String>,
    to: Option<String>,
    #[serde(default)]
    buckets: Option<u32>,
}

/// `GET /v1/volumes/{name}/diff?from=T1&to=T2`.
pub(super) async fn diff(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<SpanQuery>,
) -> ApiResult {
    let name = name_arg(name)?;
    let from = q.from.ok_or_else(|| {
        super::ApiError(crate::NodeError::BadRequest(
            "from: an instant is required".into(),
        ))
    })?;
    let to = q.to.unwrap_or_else(|| "now".into());
    let d = blocking(node, move |n| n.diff(&name, &from, &to)).await?;
    Ok(Json(d).into_response())
}

/// `GET /v1/volumes/{name}/activity?from=T1&to=T2&buckets=N`.
pub(super) async fn activity(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    Query(q): Query<SpanQuery>,
) -> ApiResult {
    let name = name_arg(name)?;
    let a = blocking(node, move |n| {
        n.activity(
            &name,
            q.from.as_deref(),
            q.to.as_deref(),
            q.buckets.unwrap_or(20),
        )
    })
    .await?;
    Ok(Json(a).into_response())
}

#[derive(Debug, Deserialize)]
pub(super) struct StartRollback {
    to: String,
    #[serde(default)]
    force: bool,
}

pub(super) async fn start_rollback(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
    req: Result<Json<StartRollback>, JsonRejection>,
) -> ApiResult {
    let name = name_arg(name)?;
    let req = body(req)?;
    let r = blocking(node, move |n| n.start_rollback(&name, &req.to, req.force)).await?;
    Ok((StatusCode::ACCEPTED, Json(r)).into_response())
}

pub(super) async fn rollback_status(
    State(node): State<Arc<Node>>,
    UrlPath(name): UrlPath<String>,
) -> ApiResult {
    let name = name_arg(name)?;
    let r = blocking(node, move |n| {
        n.rollback_info(&name)
            .ok_or_else(|| crate::NodeError::NotFound(format!("a rollback of volume {name}")))
    })
    .await?;
    Ok(Json(r).into_response())
}
