use super::*;
use crate::model::LinearModel;
use proptest::prelude::*;

const US: u64 = 1_000;

fn cfg(t_wait_ns: u64) -> PolicyConfig {
    PolicyConfig {
        t_wait_ns,
        t_switch: f64::INFINITY,
        dispatch_on_idle: false,
        queue_when_busy: false,
        device_depth: 1,
        align_bytes: 512,
        segment_bytes: 64 * 1024,
        segment_count: 8,
        data_offset: 4096,
    }
}

fn model() -> LinearModel {
    // 1 ms per write: slow enough that requests pile up behind a busy device.
    LinearModel {
        per_write_ns: 1_000 * US,
        bytes_per_sec: 1 << 30,
    }
}

fn starts(n: usize, free: u64) -> Vec<DeviceStart> {
    (0..n)
        .map(|_| DeviceStart {
            segment: 7,
            generation: 0,
            free_segments: free,
        })
        .collect()
}

fn writes(actions: &[Action]) -> Vec<Write> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Write(w) => Some(w.clone()),
            Action::SwitchSegment { .. } => None,
        })
        .collect()
}

#[test]
fn lone_writer_is_dispatched_at_once() {
    let mut p = Policy::new(cfg(500 * US), model(), &starts(1, 8));
    let mut now = 0;
    for req in 0..10 {
        let w = writes(&p.submit(req, 4160, now).unwrap());
        assert_eq!(w.len(), 1, "request {req} must go out immediately");
        assert_eq!(w[0].reqs, vec![(req, 4160)]);
        now += 1_000 * US;
        assert!(writes(&p.completed(0, now).unwrap()).is_empty());
        now += 10 * US;
    }
}

/// A burst leaves in one batch where the same requests submitted one by one leave as the
/// first alone and the rest after it; a burst larger than a segment fills it and gathers the
/// rest for the next write.
#[test]
fn a_burst_leaves_together() {
    let mut one_by_one = Policy::new(cfg(500 * US), model(), &starts(1, 8));
    let first = writes(&one_by_one.submit(0, 4160, 0).unwrap());
    assert_eq!(first[0].reqs, vec![(0, 4160)]);

    let mut p = Policy::new(cfg(500 * US), model(), &starts(1, 8));
    let burst: Vec<(u64, u64)> = (0..10).map(|r| (r, 4160)).collect();
    let w = writes(&p.submit_burst(&burst, 0).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reqs, burst);
    assert_eq!(p.gathering(), 0);

    // 20 requests of 4160 bytes: 15 fill a 64 KiB segment, the other 5 gather.
    let mut p = Policy::new(cfg(500 * US), model(), &starts(1, 8));
    let burst: Vec<(u64, u64)> = (0..20).map(|r| (r, 4160)).collect();
    let w = writes(&p.submit_burst(&burst, 0).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reqs, burst[..15].to_vec());
    assert_eq!(p.gathering(), 5);
    let w = writes(&p.completed(0, 1_000 * US).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reqs, burst[15..].to_vec());
    assert!(p.submit_burst(&[(99, 64 * 1024 + 1)], 2_000 * US).is_err());
}

#[test]
fn requests_gather_while_busy_until_t_wait() {
    let mut p = Policy::new(cfg(300 * US), model(), &starts(1, 8));
    assert_eq!(writes(&p.submit(0, 4160, 0).unwrap()).len(), 1);
    assert!(writes(&p.submit(1, 4160, 10 * US).unwrap()).is_empty());
    assert!(writes(&p.submit(2, 4160, 20 * US).unwrap()).is_empty());
    assert_eq!(p.gathering(), 2);
    assert_eq!(p.next_deadline(), Some(310 * US));
    assert!(p.poll(309 * US).is_empty());
    // T_wait passed, but the only device is still busy: the batch keeps gathering.
    assert!(writes(&p.poll(310 * US)).is_empty());
    assert_eq!(
        p.next_deadline(),
        None,
        "no timer while waiting for the device"
    );
    assert!(writes(&p.submit(3, 4160, 500 * US).unwrap()).is_empty());
    let w = writes(&p.completed(0, 1_000 * US).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reqs, vec![(1, 4160), (2, 4160), (3, 4160)]);
    assert_eq!(w[0].padded_bytes, 12800);
}

#[test]
fn dispatch_on_idle_sends_the_batch_when_the_device_frees() {
    let mut c = cfg(5_000 * US);
    c.dispatch_on_idle = true;
    let mut p = Policy::new(c, model(), &starts(1, 8));
    p.submit(0, 4160, 0).unwrap();
    p.submit(1, 4160, 10 * US).unwrap();
    let w = writes(&p.completed(0, 1_000 * US).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].reqs, vec![(1, 4160)]);
}

#[test]
fn idle_second_device_takes_the_next_request_at_once() {
    let mut p = Policy::new(cfg(300 * US), model(), &starts(2, 8));
    let a = writes(&p.submit(0, 4160, 0).unwrap());
    let b = writes(&p.submit(1, 4160, 10 * US).unwrap());
    assert_eq!((a[0].dev, b.len()), (a[0].dev, 1));
    assert_ne!(a[0].dev, b[0].dev, "the idle device must be used");
    // Both busy now: the third request gathers.
    assert!(writes(&p.submit(2, 4160, 20 * US).unwrap()).is_empty());
    assert_eq!(p.gathering(), 1);
}

#[test]
fn an_expired_batch_goes_to_whichever_device_frees_first() {
    let mut p = Policy::new(cfg(100 * US), model(), &starts(2, 8));
    let a = writes(&p.submit(0, 4160, 0).unwrap());
    let b = writes(&p.submit(1, 4160, 1).unwrap());
    p.submit(2, 4160, 10 * US).unwrap();
    assert!(p.poll(200 * US).is_empty(), "both devices busy");
    let freed = b[0].dev;
    let w = writes(&p.completed(freed, 900 * US).unwrap());
    assert_eq!(w.len(), 1);
    assert_eq!((w[0].dev, w[0].reqs.clone()), (freed, vec![(2, 4160)]));
    assert_ne!(a[0].dev, freed);
}

#[test]
fn queue_when_busy_seals_an_expired_batch_behind_the_busy_device() {
    let mut c = cfg(100 * US);
    c.queue_when_busy = true;
    let mut p = Policy::new(c, model(), &starts(1, 8));
    let first = writes(&p.submit(0, 4160, 0).unwrap());
    p.submit(1, 4160, 10 * US).unwrap();
    // T_wait expires while the only device is busy: the batch is sealed and queued, not kept.
    assert!(writes(&p.poll(110 * US)).is_empty());
    assert_eq!(p.gathering(), 0);
    // A later arrival starts a new batch instead of joining the queued one.
    p.submit(2, 4160, 120 * US).unwrap();
    assert_eq!(p.gathering(), 1);
    let w = writes(&p.completed(first[0].dev, 900 * US).unwrap());
    assert_eq!(w[0].reqs, vec![(1, 4160)]);
}

#[test]
fn without_dispatch_on_idle_a_free_device_waits_for_t_wait() {
    let mut p = Policy::new(cfg(400 * US), model(), &starts(1, 8));
    p.submit(0, 4160, 0).unwrap();
    p.submit(1, 4160, 10 * US).unwrap();
    assert!(writes(&p.completed(0, 100 * US).unwrap()).is_empty());
    let w = writes(&p.poll(410 * US));
    assert_eq!(w[0].reqs, vec![(1, 4160)]);
}

#[test]
fn a_full_segment_moves_to_the_next_with_a_new_generation() {
    let mut p = Policy::new(cfg(0), model(), &starts(1, 8));
    let mut seen = Vec::new();
    let mut now = 0;
    for req in 0..20 {
        let out = p.submit(req, 8192, now).unwrap();
        seen.extend(writes(&out));
        now += 2_000 * US;
        seen.extend(writes(&p.completed(0, now).unwrap()));
    }
    let first = &seen[0];
    let later = seen.iter().find(|w| w.segment != first.segment).unwrap();
    assert_eq!(later.generation, first.generation + 1);
    assert_eq!(later.offset, 4096 + later.segment * 64 * 1024);
    assert_eq!(
        seen.iter().filter(|w| w.segment == first.segment).count(),
        8
    );
}

#[test]
fn writers_wait_for_space_and_never_fail() {
    let mut c = cfg(0);
    c.segment_count = 2;
    let mut p = Policy::new(c, model(), &starts(1, 2));
    let mut now = 0;
    let mut done = 0;
    for req in 0..16 {
        done += writes(&p.submit(req, 16 * 1024 - 64, now).unwrap()).len();
        now += 2_000 * US;
        done += writes(&p.completed(0, now).unwrap()).len();
    }
    assert_eq!(
        done, 8,
        "two segments of four writes each, then the log is full"
    );
    assert_eq!(p.stalled(), 8);
    let resumed = writes(&p.segment_released(0, now).unwrap());
    assert_eq!(resumed.len(), 1);
    assert_eq!(
        resumed[0].reqs[0].0, 8,
        "stalled requests resume in arrival order"
    );
}

#[test]
fn fragmentation_switches_tracks_when_the_queue_is_empty() {
    let mut c = cfg(0);
    c.t_switch = 0.25;
    let mut p = Policy::new(c, model(), &starts(1, 8));
    p.submit(0, 4096, 0).unwrap();
    p.submit(1, 4096, 1).unwrap(); // queued behind request 0
    let out = p.completed(0, 1_000 * US).unwrap();
    assert!(
        !out.iter()
            .any(|a| matches!(a, Action::SwitchSegment { .. })),
        "no switch while the device has queued work"
    );
    let out = p.completed(0, 2_000 * US).unwrap();
    // Two writes in a 64 KiB segment: F = 2 / (10 * (1 - 8192/65536)) ≈ 0.23 < 0.25.
    assert!(!out
        .iter()
        .any(|a| matches!(a, Action::SwitchSegment { .. })));
    p.submit(2, 4096, 3_000 * US).unwrap();
    let out = p.completed(0, 4_000 * US).unwrap();
    assert!(out.contains(&Action::SwitchSegment {
        dev: 0,
        segment: 1,
        generation: 2
    }));
}

#[test]
fn oversized_requests_are_refused() {
    let mut p = Policy::new(cfg(0), model(), &starts(1, 8));
    assert!(matches!(
        p.submit(0, 64 * 1024 + 1, 0),
        Err(PolicyError::TooLarge { .. })
    ));
}

/// Runs a trace through the policy with completions at the model's predicted times.
fn simulate(c: PolicyConfig, devs: usize, arrivals: &[(u64, u64)]) -> Vec<Write> {
    let m = model();
    let mut p = Policy::new(c, m, &starts(devs, 8));
    let mut in_flight: Vec<Option<Nanos>> = vec![None; devs];
    let mut log = Vec::new();
    let mut next = 0;
    let mut released_at = 0;
    loop {
        let completion = in_flight
            .iter()
            .enumerate()
            .filter_map(|(d, t)| t.map(|t| (t, d)))
            .min();
        let arrival = arrivals.get(next).map(|a| a.0);
        let deadline = p.next_deadline();
        let now = [completion.map(|c| c.0), arrival, deadline]
            .into_iter()
            .flatten()
            .min();
        let Some(now) = now else {
            // Quiet, but requests wait for space: the consumers release a segment.
            if p.stalled() == 0 && p.gathering() == 0 {
                break;
            }
            let t = log.last().map_or(0, |w: &Write| w.offset) + 1;
            for d in 0..devs {
                for w in writes(&p.segment_released(d, t).unwrap()) {
                    in_flight[w.dev] = Some(m.completion_time(w.dev, w.offset, w.padded_bytes, t));
                    log.push(w);
                }
            }
            continue;
        };
        let actions = if completion.is_some_and(|c| c.0 == now) {
            let dev = completion.map_or(0, |c| c.1);
            in_flight[dev] = None;
            p.completed(dev, now).unwrap()
        } else if arrival == Some(now) {
            let (_, bytes) = arrivals[next];
            next += 1;
            p.submit(next as u64 - 1, bytes, now).unwrap()
        } else {
            p.poll(now)
        };
        for w in writes(&actions) {
            in_flight[w.dev] = Some(m.completion_time(w.dev, w.offset, w.padded_bytes, now));
            log.push(w);
        }
        // Keep space flowing: release a segment now and then so long traces never stall.
        if log.len() / 16 > released_at {
            released_at += 1;
            for d in 0..devs {
                for w in writes(&p.segment_released(d, now).unwrap()) {
                    in_flight[w.dev] =
                        Some(m.completion_time(w.dev, w.offset, w.padded_bytes, now));
                    log.push(w);
                }
            }
        }
    }
    log
}

proptest! {
    #[test]
    fn every_request_is_written_exactly_once_in_bounds(
        gaps in prop::collection::vec((0u64..2_000, 1u64..40), 1..200),
        devs in 1usize..4,
        t_wait in 0u64..1_000,
        queue_when_busy in any::<bool>(),
    ) {
        let mut t = 0;
        let arrivals: Vec<(u64, u64)> =
            gaps.iter().map(|&(g, kib)| { t += g * US; (t, kib * 512 + 64) }).collect();
        let mut c = cfg(t_wait * US);
        c.queue_when_busy = queue_when_busy;
        let log = simulate(c.clone(), devs, &arrivals);
        let mut seen: Vec<u64> = log.iter().flat_map(|w| w.reqs.iter().map(|r| r.0)).collect();
        seen.sort_unstable();
        prop_assert_eq!(seen, (0..arrivals.len() as u64).collect::<Vec<_>>());
        for w in &log {
            let seg_start = c.data_offset + w.segment * c.segment_bytes;
            prop_assert_eq!(w.offset % c.align_bytes, c.data_offset % c.align_bytes);
            prop_assert!(w.offset >= seg_start);
            prop_assert!(w.offset + w.padded_bytes <= seg_start + c.segment_bytes);
            let sum: u64 = w.reqs.iter().map(|r| r.1).sum();
            prop_assert!(w.padded_bytes >= sum && w.padded_bytes < sum + c.align_bytes);
        }
        // Same trace, same decisions.
        prop_assert_eq!(simulate(c, devs, &arrivals), log);
    }
}

#[test]
fn a_batch_queued_behind_a_busy_device_keeps_its_segment_marked() {
    let mut p = Policy::new(cfg(1_000 * US), model(), &starts(1, 8));
    let first = writes(&p.submit(0, 40_000, 0).unwrap());
    let seg = first[0].segment;
    // Fits beside the first write: gathers for the same segment while the device is busy.
    p.submit(1, 20_000, 10 * US).unwrap();
    // Does not fit: the gathered batch is sealed and queued into `seg`, the device moves on.
    p.submit(2, 30_000, 20 * US).unwrap();
    assert!(
        p.has_queued_write(0, seg),
        "sealed batch waits to be written into {seg}"
    );
    let w = writes(&p.completed(0, 1_000 * US).unwrap());
    assert_eq!((w[0].segment, w[0].reqs.clone()), (seg, vec![(1, 20_000)]));
    assert!(!p.has_queued_write(0, seg));
}
