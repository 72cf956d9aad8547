//! Feeding requests to a model: one driver for every model (the conventional disk, Trail, the
//! Mariner log array, the EW-Array and its baselines) and every arrival process of
//! [`Arrivals`] — open loops (exponential or fixed inter-arrival times, trail-paper.md §3.1,
//! mariner-paper.md §7.2–7.3; or a trace) and the Iometer-style closed loop that keeps a
//! constant number of requests outstanding (ew-array-paper.txt §3.4: "adding a new request to
//! the queue as soon as an old one is retired from it").
//!
//! A model is an event-driven state machine ([`Model`]); what a request asks for comes from a
//! [`Source`]; the driver decides when requests arrive. Arrival times are rounded to whole
//! nanoseconds (the placement policy's clock), so every model sees the same instants and the
//! Mariner array's integer-nanosecond ties keep their order. At equal times a model's own event
//! (a completion, a timer) comes before an arrival.

use crate::rng::SplitMix64;
use crate::stats::Mean;
use crate::workload::{Arrivals, Request};

/// A simulated device or array, driven one event at a time.
pub trait Model {
    /// Accepts request `id` (ids count up from 0 in arrival order) at `req.arrival_ms`. A model
    /// that completes it at once pushes `id` onto `done`.
    fn submit(&mut self, id: usize, req: &Request, done: &mut Vec<usize>);
    /// The time of the model's next event (a completion or a timer), if it has one.
    fn next_event_ms(&self) -> Option<f64>;
    /// Processes that event and pushes the ids of the requests it completed onto `done`.
    fn step(&mut self, done: &mut Vec<usize>);
}

/// What requests ask for: operation, address and length. The driver sets `arrival_ms`.
pub trait Source {
    fn draw(&mut self, rng: &mut SplitMix64) -> Request;
}

/// What the driver saw, whatever the model.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Driven {
    pub issued: usize,
    pub latency_ms: Mean,
    pub read_ms: Mean,
    pub write_ms: Mean,
    /// Time of the last completion.
    pub elapsed_ms: f64,
    /// Fewest and most requests outstanding after each event while the source was still
    /// feeding (a closed loop keeps both at its depth).
    pub outstanding_min: usize,
    pub outstanding_max: usize,
}

impl Driven {
    /// Completed requests per second.
    pub fn throughput(&self) -> f64 {
        self.latency_ms.count as f64 / (self.elapsed_ms.max(1e-9) / 1000.0)
    }
}

/// Rounds a time to whole nanoseconds.
pub fn to_ns_grid(ms: f64) -> f64 {
    (ms * 1e6).round() / 1e6
}

/// Drives `count` requests drawn from `source` into `model`, arriving as `arrivals` says.
/// `rng` is the workload's own stream (the model keeps its own).
pub fn drive<M: Model, S: Source>(
    model: &mut M,
    source: &mut S,
    arrivals: Arrivals,
    count: usize,
    rng: &mut SplitMix64,
) -> Driven {
    match arrivals {
        Arrivals::Closed { depth } => closed(model, source, depth, count, rng),
        open => {
            let mut t = 0.0;
            open_loop(model, count, |i| {
                // Request i's gap comes before its content, as trail-paper §3.1's generator
                // draws them (`Synthetic::generate`).
                t = match open {
                    Arrivals::Fixed { interval_ms } => i as f64 * interval_ms,
                    _ if i == 0 => 0.0,
                    _ => t + open.gap_ms(rng),
                };
                Request {
                    arrival_ms: t,
                    ..source.draw(rng)
                }
            })
        }
    }
}

/// Drives a recorded trace (arrival times non-decreasing) into `model`.
pub fn drive_trace<M: Model>(model: &mut M, reqs: &[Request]) -> Driven {
    open_loop(model, reqs.len(), |i| reqs[i])
}

struct Book {
    arrival: Vec<f64>,
    write: Vec<bool>,
    out: Driven,
    done: Vec<usize>,
}

impl Book {
    fn new(count: usize) -> Self {
        Self {
            arrival: Vec::with_capacity(count),
            write: Vec::with_capacity(count),
            out: Driven {
                outstanding_min: usize::MAX,
                ..Driven::default()
            },
            done: Vec::new(),
        }
    }

    fn submit<M: Model>(&mut self, model: &mut M, mut req: Request) {
        req.arrival_ms = to_ns_grid(req.arrival_ms);
        let id = self.arrival.len();
        self.arrival.push(req.arrival_ms);
        self.write.push(req.write);
        self.out.issued += 1;
        model.submit(id, &req, &mut self.done);
    }

    /// Accounts one completion at `now`.
    fn complete(&mut self, id: usize, now: f64) {
        let lat = now - self.arrival[id];
        self.out.latency_ms.add(lat);
        if self.write[id] {
            self.out.write_ms.add(lat);
        } else {
            self.out.read_ms.add(lat);
        }
        self.out.elapsed_ms = self.out.elapsed_ms.max(now);
    }

    fn sample_outstanding(&mut self) {
        let n = self.out.issued - self.out.latency_ms.count as usize;
        self.out.outstanding_min = self.out.outstanding_min.min(n);
        self.out.outstanding_max = self.out.outstanding_max.max(n);
    }

    fn finish(mut self) -> Driven {
        if self.out.outstanding_min == usize::MAX {
            self.out.outstanding_min = 0;
        }
        self.out
    }
}

fn open_loop<M: Model>(
    model: &mut M,
    count: usize,
    mut next: impl FnMut(usize) -> Request,
) -> Driven {
    let mut book = Book::new(count);
    let mut pending = (count > 0).then(|| next(0));
    let mut now: f64;
    loop {
        let event = model.next_event_ms();
        match (event, pending) {
            (Some(e), p) if p.is_none_or(|r| e <= to_ns_grid(r.arrival_ms)) => {
                now = e;
                model.step(&mut book.done);
            }
            (_, Some(r)) => {
                now = to_ns_grid(r.arrival_ms);
                book.submit(model, r);
                let i = book.out.issued;
                pending = (i < count).then(|| next(i));
            }
            (None, None) => break,
            (Some(_), None) => unreachable!("covered by the first arm"),
        }
        while let Some(id) = book.done.pop() {
            book.complete(id, now);
        }
        if pending.is_some() {
            book.sample_outstanding();
        }
    }
    book.finish()
}

fn closed<M: Model, S: Source>(
    model: &mut M,
    source: &mut S,
    depth: usize,
    count: usize,
    rng: &mut SplitMix64,
) -> Driven {
    let mut book = Book::new(count);
    let mut now = 0.0;
    let mut completed = Vec::new();
    for _ in 0..depth.min(count) {
        book.submit(model, source.draw(rng));
    }
    loop {
        // Each completion (also one a submission caused at once) brings a new request.
        while !book.done.is_empty() {
            completed.append(&mut book.done);
            for id in completed.drain(..) {
                book.complete(id, now);
                if book.out.issued < count {
                    let req = Request {
                        arrival_ms: now,
                        ..source.draw(rng)
                    };
                    book.submit(model, req);
                }
            }
        }
        if book.out.issued < count {
            book.sample_outstanding();
        }
        if book.out.latency_ms.count as usize >= count {
            break;
        }
        let Some(e) = model.next_event_ms() else {
            break;
        };
        now = e;
        model.step(&mut book.done);
    }
    book.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One server, fixed service time, FIFO.
    struct Fifo {
        service_ms: f64,
        queue: std::collections::VecDeque<usize>,
        busy: Option<(f64, usize)>,
        now: f64,
    }

    impl Model for Fifo {
        fn submit(&mut self, id: usize, req: &Request, _: &mut Vec<usize>) {
            self.now = req.arrival_ms;
            self.queue.push_back(id);
            if self.busy.is_none() {
                self.start();
            }
        }
        fn next_event_ms(&self) -> Option<f64> {
            self.busy.map(|b| b.0)
        }
        fn step(&mut self, done: &mut Vec<usize>) {
            if let Some((t, id)) = self.busy.take() {
                self.now = t;
                done.push(id);
                self.start();
            }
        }
    }

    impl Fifo {
        fn start(&mut self) {
            if let Some(id) = self.queue.pop_front() {
                self.busy = Some((self.now + self.service_ms, id));
            }
        }
    }

    struct Reads;
    impl Source for Reads {
        fn draw(&mut self, _: &mut SplitMix64) -> Request {
            Request {
                arrival_ms: 0.0,
                write: false,
                lba: 0,
                bytes: 512,
            }
        }
    }

    fn fifo() -> Fifo {
        Fifo {
            service_ms: 2.0,
            queue: Default::default(),
            busy: None,
            now: 0.0,
        }
    }

    #[test]
    fn a_closed_loop_keeps_its_depth_and_littles_law_holds() {
        let d = drive(
            &mut fifo(),
            &mut Reads,
            Arrivals::Closed { depth: 5 },
            1_000,
            &mut SplitMix64::new(1),
        );
        assert_eq!((d.outstanding_min, d.outstanding_max), (5, 5));
        assert_eq!(d.latency_ms.count, 1_000);
        // One server at 2 ms: 500/s whatever the depth; each request waits for the 4 ahead.
        assert!((d.throughput() - 500.0).abs() < 1.0, "{}", d.throughput());
        assert!((d.latency_ms.mean() - 10.0).abs() < 0.1);
    }

    #[test]
    fn an_open_loop_spaces_fixed_arrivals_exactly() {
        let d = drive(
            &mut fifo(),
            &mut Reads,
            Arrivals::Fixed { interval_ms: 3.0 },
            100,
            &mut SplitMix64::new(1),
        );
        assert!((d.latency_ms.mean() - 2.0).abs() < 1e-9);
        assert!((d.elapsed_ms - (99.0 * 3.0 + 2.0)).abs() < 1e-9);
        assert_eq!(d.outstanding_max, 1);
    }
}
