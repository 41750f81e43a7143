//! A checked request on its way through the engine thread, whatever the
//! dialect: submitted under the server's limits, then either collected
//! whole ([`Finished`]) or streamed as server-sent events that a dialect's
//! [`Render`] writes.

use crate::api::{ApiError, FinishReason, Usage};
use crate::http_metrics::InFlight;
use crate::routes::ServerState;
use crate::scheduler::{Event, GenRequest};
use crate::template::tool_calls::{self, Parsed, StreamParser};
use axum::response::sse::{self, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use coil::engine::constraint::Constraint;
use coil::engine::logprobs::TokenLogprob;
use coil::engine::sampling::SamplingParams;
use futures_util::stream::{self, Stream};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Instant;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// A request ready for the engine thread.
#[derive(Debug)]
pub struct Job {
    pub prompt: Vec<u32>,
    /// Checkpoint positions for the scheduler (`GenRequest::marks`).
    pub marks: Vec<usize>,
    pub params: SamplingParams,
    pub max_tokens: usize,
    pub stop: Vec<String>,
    pub stop_at_eos: bool,
    pub n: usize,
    pub logprobs: Option<usize>,
    pub stream: bool,
    /// Reads tool calls and reasoning out of a chat reply (`None`: the
    /// reply is its raw text); each choice reads with a copy.
    pub parser: Option<StreamParser>,
    /// The output constraint, compiled, at its first position (each choice
    /// advances a fork of it).
    pub constraint: Option<Constraint>,
}

/// One finished choice.
#[derive(Clone, Debug, Default)]
pub struct Choice {
    pub text: String,
    pub finish: Option<FinishReason>,
    /// The stop string that ended it.
    pub stop: Option<String>,
    pub logprobs: Vec<TokenLogprob>,
}

impl Choice {
    /// The reply read with `parser` (`None`: the text is the content).
    pub fn parsed(&self, parser: Option<&StreamParser>) -> Parsed {
        match parser.cloned() {
            Some(mut p) => {
                let mut deltas = p.push(&self.text);
                deltas.extend(p.finish());
                tool_calls::collect(deltas)
            }
            None => Parsed {
                content: Some(self.text.clone()),
                ..Default::default()
            },
        }
    }

    pub fn finish(&self) -> FinishReason {
        self.finish.unwrap_or(FinishReason::Stop)
    }
}

/// Every choice of a finished request, and the request's token counts
/// (the prompt once, the completions of all choices).
#[derive(Clone, Debug, Default)]
pub struct Finished {
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

/// Adds a choice's counts to the request's.
fn add_usage(total: &mut Usage, u: &Usage) {
    total.prompt_tokens = u.prompt_tokens;
    total.cached_tokens = u.cached_tokens;
    total.completion_tokens += u.completion_tokens;
    total.draft_tokens += u.draft_tokens;
    total.accepted_draft_tokens += u.accepted_draft_tokens;
}

/// A job submitted to the engine thread.
pub struct Submitted {
    rx: UnboundedReceiver<Event>,
    flight: InFlight,
    deadline: Option<(tokio::time::Instant, ApiError)>,
    n: usize,
}

/// Submits `job` (which arrived at `start`) under the server's limits;
/// the response of a refusal (queue full, shutting down) otherwise.
pub fn submit(st: &ServerState, job: &Job, start: Instant) -> Result<Submitted, Box<Response>> {
    let flight = st
        .limits
        .admit(&st.scheduler.metrics, start)
        .map_err(|r| Box::new(r.into_response()))?;
    let (tx, rx) = unbounded_channel();
    let submitted = st.scheduler.submit(GenRequest {
        prompt: job.prompt.clone(),
        params: job.params.clone(),
        max_tokens: job.max_tokens,
        stop: job.stop.clone(),
        stop_at_eos: job.stop_at_eos,
        marks: job.marks.clone(),
        n: job.n,
        logprobs: job.logprobs,
        constraint: job.constraint.clone(),
        events: tx,
    });
    if !submitted {
        return Err(Box::new(
            ApiError::unavailable("the engine has stopped").into_response(),
        ));
    }
    let deadline = st
        .limits
        .deadline(start)
        .map(|d| (d, st.limits.timeout_error()));
    Ok(Submitted {
        rx,
        flight,
        deadline,
        n: job.n,
    })
}

impl Submitted {
    /// Waits for every choice to end. Past the deadline, returning drops
    /// the receiver: the engine thread frees the slots.
    pub async fn collect(mut self) -> Result<Finished, ApiError> {
        let mut out = Finished {
            choices: vec![Choice::default(); self.n],
            usage: Usage::default(),
        };
        let mut left = self.n;
        loop {
            let ev = match &self.deadline {
                Some((d, err)) => match tokio::time::timeout_at(*d, self.rx.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        self.flight.timed_out();
                        return Err(err.clone());
                    }
                },
                None => self.rx.recv().await,
            };
            let Some(ev) = ev else { break };
            match ev {
                Event::Text {
                    choice,
                    text,
                    logprobs,
                } => {
                    self.flight.first_output();
                    if let Some(c) = out.choices.get_mut(choice) {
                        c.text.push_str(&text);
                        c.logprobs.extend(logprobs);
                    }
                }
                Event::Done {
                    choice,
                    finish,
                    usage,
                    stop,
                } => {
                    add_usage(&mut out.usage, &usage);
                    if let Some(c) = out.choices.get_mut(choice) {
                        c.finish = Some(finish);
                        c.stop = stop;
                    }
                    left -= 1;
                    if left == 0 {
                        self.flight.done(&out.usage);
                        return Ok(out);
                    }
                }
                Event::Error(m) => return Err(ApiError::server(m)),
            }
        }
        Err(ApiError::server(
            "the engine stopped before the request ended",
        ))
    }

    /// Streams the request's events as `render` writes them.
    /// Dropping the stream (client gone, or the deadline passed) drops the
    /// receiver, which tells the engine thread to free the request's slots.
    pub fn stream(self, mut render: impl Render) -> Response {
        let out: VecDeque<sse::Event> = render.start().into();
        let st = StreamState {
            rx: self.rx,
            flight: self.flight,
            deadline: self.deadline,
            left: self.n,
            usage: Usage::default(),
            out,
            ended: false,
            render,
        };
        Sse::new(events(st))
            .keep_alive(KeepAlive::default())
            .into_response()
    }
}

/// What a dialect writes for each stage of a streamed request.
pub trait Render: Send + 'static {
    /// Before anything is generated.
    fn start(&mut self) -> Vec<sse::Event>;
    /// Generated text of `choice`, and the log-probabilities of the
    /// tokens sampled since its last text.
    fn text(&mut self, choice: usize, text: &str, logprobs: Vec<TokenLogprob>) -> Vec<sse::Event>;
    /// `choice` ended (`stop`: the stop string that ended it).
    fn done(&mut self, choice: usize, finish: FinishReason, stop: Option<&str>) -> Vec<sse::Event>;
    /// Every choice ended; `usage` counts them all.
    fn end(&mut self, usage: &Usage) -> Vec<sse::Event>;
    /// The request failed mid-way (the stream ends after these).
    fn error(&mut self, err: &ApiError) -> Vec<sse::Event>;
}

struct StreamState<R> {
    rx: UnboundedReceiver<Event>,
    flight: InFlight,
    deadline: Option<(tokio::time::Instant, ApiError)>,
    left: usize,
    usage: Usage,
    out: VecDeque<sse::Event>,
    ended: bool,
    render: R,
}

fn events<R: Render>(st: StreamState<R>) -> impl Stream<Item = Result<sse::Event, Infallible>> {
    stream::unfold(st, |mut st| async move {
        loop {
            if let Some(ev) = st.out.pop_front() {
                return Some((Ok(ev), st));
            }
            if st.ended {
                return None;
            }
            let ev = match &st.deadline {
                Some((d, err)) => match tokio::time::timeout_at(*d, st.rx.recv()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        st.flight.timed_out();
                        let err = err.clone();
                        st.out.extend(st.render.error(&err));
                        st.ended = true;
                        continue;
                    }
                },
                None => st.rx.recv().await,
            };
            let Some(ev) = ev else {
                let e = ApiError::server("the engine stopped before the request ended");
                st.out.extend(st.render.error(&e));
                st.ended = true;
                continue;
            };
            st.push(ev);
        }
    })
}

impl<R: Render> StreamState<R> {
    fn push(&mut self, ev: Event) {
        match ev {
            Event::Text {
                choice,
                text,
                logprobs,
            } => {
                self.flight.first_output();
                self.out.extend(self.render.text(choice, &text, logprobs));
            }
            Event::Done {
                choice,
                finish,
                usage,
                stop,
            } => {
                add_usage(&mut self.usage, &usage);
                self.out
                    .extend(self.render.done(choice, finish, stop.as_deref()));
                self.left -= 1;
                if self.left == 0 {
                    self.flight.done(&self.usage);
                    self.out.extend(self.render.end(&self.usage));
                    self.ended = true;
                }
            }
            Event::Error(m) => {
                self.out.extend(self.render.error(&ApiError::server(m)));
                self.ended = true;
            }
        }
    }
}

/// A server-sent event whose data is `v` (no event name: OpenAI's chat
/// and completion chunks).
pub fn data(v: &serde_json::Value) -> sse::Event {
    sse::Event::default().data(v.to_string())
}

/// A server-sent event named by `v["type"]` (Anthropic's and the
/// Responses API's streams), its data `v`.
pub fn typed(v: &serde_json::Value) -> sse::Event {
    let name = v["type"].as_str().unwrap_or("message");
    sse::Event::default().event(name).data(v.to_string())
}
