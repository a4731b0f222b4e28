//! Paging of big jobs over HTTP, against a real master in a temp dir (no agents: a
//! job of 10,000 instances stays PENDING): the job read's first page is small and
//! carries the whole job's summary, `next_after` walks every instance exactly once,
//! the change stream's `limit` pages walk every task exactly once, and bad paging
//! parameters are refused `400 invalid_query` naming the parameter.

#![allow(clippy::unwrap_used)] // unwrap is how tests fail

mod common;

use std::collections::BTreeSet;

use common::{job, start, Client};
use drover_common::wire::{ChangesView, JobView, MAX_CHANGES_PAGE, MAX_INSTANCE_PAGE};
use drover_common::TaskState;
use serde_json::Value;

const BIG: u32 = 10_000;
const KEY: &str = "www/prod/big";

/// GET `path` with the admin token: status and the raw body.
async fn get_bytes(c: &Client, path: &str) -> (u16, Vec<u8>) {
    let r = c
        .http
        .get(format!("{}{path}", c.base))
        .bearer_auth(&c.admin)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.bytes().await.unwrap().to_vec())
}

async fn job_page(c: &Client, query: &str) -> (JobView, usize) {
    let (status, body) = get_bytes(c, &format!("/v1/jobs/{KEY}?{query}")).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    (serde_json::from_slice(&body).unwrap(), body.len())
}

async fn big_job(c: &Client) {
    let (s, created) = c.post("/v1/jobs", &job("big", BIG, false)).await;
    assert_eq!(s, 201, "{created}");
}

#[tokio::test]
async fn a_big_jobs_first_page_is_small_and_the_pages_walk_every_instance_once() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    big_job(&c).await;

    // The web UI's first load of the job page: the job's summary with its first
    // 100 instances, and the change stream's start (one task, for `head`).
    let (first, job_bytes) = job_page(&c, "limit=100").await;
    let (status, body) = get_bytes(&c, "/v1/changes?index=0&limit=1&wait_ms=0").await;
    assert_eq!(status, 200);
    let live: ChangesView = serde_json::from_slice(&body).unwrap();
    let live_bytes = body.len();
    eprintln!("first load: job page {job_bytes} bytes, change stream start {live_bytes} bytes");
    assert!(
        job_bytes + live_bytes < 1_000_000,
        "the first load is {} bytes",
        job_bytes + live_bytes
    );
    assert_eq!(first.instance_count, BIG);
    assert_eq!(first.state_counts.get(&TaskState::Pending), Some(&BIG));
    assert_eq!(first.config_counts.values().sum::<u32>(), BIG);
    assert_eq!(first.configs.len(), 1);
    assert!(first.recent_events.len() <= 50 && !first.recent_events.is_empty());
    assert_eq!(first.instances.len(), 100);
    assert_eq!(first.next_after, Some(99));
    assert!(live.more && live.head >= live.index, "{live:?}");

    // Walk the job with the biggest pages: every instance exactly once, in order.
    let mut seen = Vec::new();
    let mut after: Option<u32> = None;
    let mut pages = 0;
    loop {
        let query = match after {
            Some(a) => format!("limit={MAX_INSTANCE_PAGE}&after={a}"),
            None => format!("limit={MAX_INSTANCE_PAGE}"),
        };
        let (page, _) = job_page(&c, &query).await;
        assert!(page.instances.len() <= MAX_INSTANCE_PAGE as usize);
        assert_eq!(page.instance_count, BIG, "every page carries the summary");
        seen.extend(page.instances.iter().map(|i| i.instance));
        pages += 1;
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
        assert!(pages <= BIG / MAX_INSTANCE_PAGE, "too many pages");
    }
    assert_eq!(seen, (0..BIG).collect::<Vec<_>>());
    assert_eq!(pages, BIG / MAX_INSTANCE_PAGE);

    // A state filter pages the same; a state no instance is in answers none.
    let (pending, _) = job_page(&c, "limit=10&after=9994&state=pending").await;
    let numbers: Vec<u32> = pending.instances.iter().map(|i| i.instance).collect();
    assert_eq!(numbers, vec![9995, 9996, 9997, 9998, 9999]);
    assert_eq!(pending.next_after, None);
    let (running, _) = job_page(&c, "limit=10&state=RUNNING").await;
    assert!(running.instances.is_empty() && running.next_after.is_none());

    // Without `limit` the read is as before paging: every instance.
    let (whole, whole_bytes) = job_page(&c, "").await;
    assert_eq!(whole.instances.len(), BIG as usize);
    assert_eq!(whole.next_after, None);
    eprintln!("the whole job unpaged: {whole_bytes} bytes");

    // The change stream in pages of 1,000: every task of the job exactly once.
    let mut tasks = BTreeSet::new();
    let mut index = 0;
    let mut after_task: Option<String> = None;
    for _ in 0..=BIG / 1000 + 2 {
        let mut path = format!("/v1/changes?index={index}&limit=1000&wait_ms=0");
        if let Some(a) = &after_task {
            path.push_str(&format!("&after={a}"));
        }
        let (status, body) = c.get(&path).await;
        assert_eq!(status, 200, "{body}");
        let page: ChangesView = serde_json::from_value(body).unwrap();
        assert!(page.tasks.len() <= 1000);
        for t in &page.tasks {
            assert!(tasks.insert(t.task_id.clone()), "{} twice", t.task_id);
        }
        index = page.index;
        after_task = page.after.clone();
        if !page.more {
            assert_eq!(page.index, page.head);
            break;
        }
    }
    assert_eq!(tasks.len(), BIG as usize);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn bad_paging_parameters_are_refused_naming_the_parameter() {
    let dir = tempfile::tempdir().unwrap();
    let h = start(dir.path()).await;
    let c = Client::new(&h);
    c.post("/v1/jobs", &job("small", 3, false)).await;
    let refused = |(status, body): (u16, Value), field: &str| {
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["code"], "invalid_query", "{body}");
        assert_eq!(body["error"]["field"], field, "{body}");
        let message = body["error"]["message"].as_str().unwrap().to_string();
        assert!(message.starts_with(field), "{message}");
    };
    let over = MAX_INSTANCE_PAGE + 1;
    for query in ["limit=0", &format!("limit={over}"), "limit=ten", "limit=-1"] {
        refused(
            c.get(&format!("/v1/jobs/www/prod/small?{query}")).await,
            "limit",
        );
    }
    for query in ["after=-1", "after=x", "limit=5&after=4294967296"] {
        refused(
            c.get(&format!("/v1/jobs/www/prod/small?{query}")).await,
            "after",
        );
    }
    refused(
        c.get("/v1/jobs/www/prod/small?state=SLEEPING").await,
        "state",
    );
    let over = MAX_CHANGES_PAGE + 1;
    for query in ["limit=0", &format!("limit={over}"), "limit=many"] {
        refused(
            c.get(&format!("/v1/changes?{query}&wait_ms=0")).await,
            "limit",
        );
    }
    refused(c.get("/v1/changes?after=t-1&wait_ms=0").await, "after");
    // The limits themselves are fine.
    let (s, _) = c
        .get(&format!(
            "/v1/jobs/www/prod/small?limit={MAX_INSTANCE_PAGE}"
        ))
        .await;
    assert_eq!(s, 200);
    let (s, _) = c
        .get(&format!("/v1/changes?limit={MAX_CHANGES_PAGE}&wait_ms=0"))
        .await;
    assert_eq!(s, 200);
    h.stop().await.unwrap();
}
