//! Server-sent events for `stream: true`: each step of a [`Running`] request becomes zero or more
//! `data: {json}` events, then `data: [DONE]` (chat and completions, as OpenAI ends them; the
//! Responses API's typed events end with its last event, no `[DONE]`: [`Ending`]). A failure
//! midway is sent as an error-body event before the end (an `error` event in the Responses API). When the client goes away the stream (and with it the request) is dropped,
//! which cancels the request in the engine.

use std::collections::VecDeque;
use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use futures_util::Stream;

use crate::run::{Running, Step};

/// One event: `data`, with an `event:` name when the API types its events (Responses API).
pub struct SseData {
    pub event: Option<&'static str>,
    pub data: String,
}

impl From<String> for SseData {
    fn from(data: String) -> Self {
        SseData { event: None, data }
    }
}

struct State<F> {
    running: Running,
    queued: VecDeque<SseData>,
    ended: bool,
    on_step: F,
}

/// How a stream ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// `data: [DONE]` (chat completions, completions); an error is its OpenAI error body.
    Done,
    /// Nothing after the last event (Responses API); an error is an `error` event,
    /// `{"type": "error", "code", "message", "param"}`.
    Typed,
}

/// Streams `prelude`, then what `on_step` makes of each step, then `[DONE]`.
pub fn stream<F, T>(
    running: Running,
    prelude: Vec<T>,
    on_step: F,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    F: FnMut(&Running, Step) -> Vec<T> + Send + 'static,
    T: Into<SseData>,
{
    stream_ending(running, prelude, on_step, Ending::Done)
}

/// Streams `prelude`, then what `on_step` makes of each step, ending as `ending` says.
pub fn stream_ending<F, T>(
    running: Running,
    prelude: Vec<T>,
    mut on_step: F,
    ending: Ending,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>>
where
    F: FnMut(&Running, Step) -> Vec<T> + Send + 'static,
    T: Into<SseData>,
{
    let state = State {
        running,
        queued: prelude.into_iter().map(Into::into).collect(),
        ended: false,
        on_step: move |r: &Running, step: Step| -> Vec<SseData> {
            on_step(r, step).into_iter().map(Into::into).collect()
        },
    };
    let s = futures_util::stream::unfold(state, move |mut st| async move {
        loop {
            if let Some(item) = st.queued.pop_front() {
                let mut ev = Event::default();
                if let Some(name) = item.event {
                    ev = ev.event(name);
                }
                return Some((Ok(ev.data(item.data)), st));
            }
            if st.ended {
                return None;
            }
            match st.running.next().await {
                Ok(Some(step)) => {
                    let done = matches!(step, Step::Done(_));
                    let out = (st.on_step)(&st.running, step);
                    st.queued.extend(out);
                    if done {
                        st.end(ending);
                    }
                }
                Ok(None) => st.end(ending),
                Err(e) => {
                    let body = e.body();
                    st.queued.push_back(match ending {
                        Ending::Done => serde_json::to_string(&body).unwrap_or_default().into(),
                        Ending::Typed => SseData {
                            event: Some("error"),
                            data: serde_json::json!({"type": "error",
                                "code": body.error.code, "message": body.error.message,
                                "param": body.error.param})
                            .to_string(),
                        },
                    });
                    st.end(ending);
                }
            }
        }
    });
    Sse::new(s)
}

impl<F> State<F> {
    fn end(&mut self, ending: Ending) {
        if ending == Ending::Done {
            self.queued.push_back(api::STREAM_DONE.to_string().into());
        }
        self.ended = true;
    }
}

/// JSON of a serialisable chunk (serialising plain wire structs cannot fail).
pub fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("wire types serialise to JSON")
}
