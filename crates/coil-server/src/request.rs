//! The one internal request every API dialect (OpenAI chat and
//! completions, Anthropic Messages, OpenAI Responses) translates its
//! request into, and how it becomes a [`Job`] for the engine thread:
//! rendered with the chat template, tokenized, checked against the
//! context and the server's limits.

use crate::api::{ApiError, OutputSpec};
use crate::job::Job;
use crate::routes::ServerState;
use crate::template::tool_calls::StreamParser;
use crate::template::{ChatTemplate, TemplateVars, RESERVED};
use coil::engine::sampling::SamplingParams;
use coil::tokenizer::{EncodeOptions, Tokenizer};
use serde_json::{Map, Value};

/// What to generate from, in a dialect-neutral form.
#[derive(Clone, Debug)]
pub struct Request {
    pub input: Input,
    pub params: SamplingParams,
    /// The completion's length as asked, and the field that asked.
    pub max_tokens: Option<u64>,
    pub max_tokens_param: &'static str,
    pub stop: Vec<String>,
    /// Keep generating after an end-of-generation token.
    pub ignore_eos: bool,
    /// Choices, forked from the one processed prompt.
    pub n: usize,
    /// Report the top `k` log-probabilities of each token (`Some(k)`).
    pub logprobs: Option<usize>,
    pub stream: bool,
    /// What the output must be (structured outputs; see
    /// [`crate::structured`]): JSON, a schema or a grammar. A forced tool
    /// call is asked by [`Chat::tool_choice`] instead.
    pub output: Option<OutputSpec>,
}

#[derive(Clone, Debug)]
pub enum Input {
    /// A raw prompt (completions), text or token ids.
    Prompt(Prompt),
    Chat(Chat),
}

#[derive(Clone, Debug)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

/// A conversation in OpenAI's chat shape: `messages` with string
/// `content`, `tool_calls[].function.arguments` as objects, `tool`
/// messages with `tool_call_id`.
#[derive(Clone, Debug, Default)]
pub struct Chat {
    pub messages: Vec<Value>,
    /// OpenAI function tools (`{"type": "function", "function": {...}}`).
    pub tools: Option<Value>,
    pub tool_choice: ToolChoice,
    /// With a forced tool call: exactly one call (else one or more).
    pub one_tool_call: bool,
    /// Extra template variables (`enable_thinking`, `reasoning_effort`).
    pub kwargs: Map<String, Value>,
}

/// What `tool_choice` asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides; its tool calls are read out of the reply.
    #[default]
    Auto,
    /// Tools stay in the prompt; the reply is not read for tool calls.
    None,
    /// The reply must be tool calls (any of the tools), in the template's
    /// syntax ([`crate::structured`]).
    Required,
    /// The reply must call this function.
    Function(String),
}

impl ToolChoice {
    /// Whether the reply must be tool calls.
    pub fn forces(&self) -> bool {
        matches!(self, ToolChoice::Required | ToolChoice::Function(_))
    }
}

impl Chat {
    /// The chat template's variables, `tools` checked to be a list of
    /// objects and no reserved name among the extra ones.
    pub fn template_vars(&self) -> Result<TemplateVars, ApiError> {
        let tools = match &self.tools {
            None | Some(Value::Null) => None,
            Some(Value::Array(list)) => {
                if let Some(i) = list.iter().position(|t| !t.is_object()) {
                    return Err(ApiError::bad_request(format!(
                        "tools[{i}] must be an object ({{\"type\": \"function\", \"function\": {{...}}}})"
                    ))
                    .with_param("tools"));
                }
                Some(Value::Array(list.clone()))
            }
            Some(_) => {
                return Err(ApiError::bad_request("tools must be a list").with_param("tools"))
            }
        };
        if let Some(k) = self.kwargs.keys().find(|k| RESERVED.contains(&k.as_str())) {
            return Err(ApiError::bad_request(format!(
                "chat_template_kwargs.{k} cannot be set (the request gives it)"
            ))
            .with_param("chat_template_kwargs"));
        }
        Ok(TemplateVars {
            tools,
            kwargs: self.kwargs.clone(),
        })
    }
}

/// The job of a request: a chat rendered with the template (and a parser
/// for the reasoning and tool calls of its reply), the prompt tokenized,
/// `n`, `logit_bias` and the length checked against the context and the
/// server's limits.
pub fn prepare(st: &ServerState, req: Request) -> Result<Job, ApiError> {
    if req.n == 0 || req.n > st.scheduler.parallel {
        return Err(ApiError::bad_request(format!(
            "n must be between 1 and {} (this server's --parallel), got {}",
            st.scheduler.parallel, req.n
        ))
        .with_param("n"));
    }
    let (prompt, marks, parser, default_max, extra_stops, output) = match &req.input {
        Input::Prompt(p) => (
            completion_prompt(st, p)?,
            Vec::new(),
            None,
            Some(16),
            Vec::new(),
            req.output.clone().or_else(|| st.default_output()),
        ),
        Input::Chat(chat) => {
            let vars = chat.template_vars()?;
            let text = render_chat(&st.template, &chat.messages, &vars)?;
            let prompt = encode_rendered(&st.template, &st.tokenizer, &text);
            if prompt.is_empty() {
                return Err(ApiError::bad_request("the rendered chat prompt is empty")
                    .with_param("messages"));
            }
            let output = if chat.tool_choice.forces() {
                if let Some(o) = &req.output {
                    return Err(ApiError::bad_request(format!(
                        "{} cannot be combined with a tool_choice that requires a tool call",
                        o.param
                    ))
                    .with_param(o.param));
                }
                Some(crate::structured::tool_call_spec(
                    st.template.output_format,
                    &text,
                    vars.tools.as_ref(),
                    &chat.tool_choice,
                    !chat.one_tool_call,
                    &st.tokenizer,
                )?)
            } else {
                req.output.clone().or_else(|| st.default_output())
            };
            let read_tools = vars
                .tools
                .as_ref()
                .filter(|_| chat.tool_choice != ToolChoice::None);
            let parser = StreamParser::new(st.template.output_format, &text, read_tools);
            let marks = message_ends(&st.template, &st.tokenizer, &chat.messages, &vars, &prompt);
            let parser = parser.is_active().then_some(parser);
            (
                prompt,
                marks,
                parser,
                None,
                st.template.extra_stops.clone(),
                output,
            )
        }
    };
    if let Some(&(t, _)) = req
        .params
        .logit_bias
        .iter()
        .find(|b| b.0 as usize >= st.scheduler.n_vocab)
    {
        return Err(ApiError::bad_request(format!(
            "logit_bias: token id {t} is outside the vocabulary of {}",
            st.scheduler.n_vocab
        ))
        .with_param("logit_bias"));
    }
    let param = req.max_tokens_param;
    let max_tokens = token_limit(
        prompt.len(),
        req.max_tokens,
        default_max,
        st.scheduler.n_ctx,
        param,
    )?
    .min(st.limits.max_tokens(req.max_tokens, param)?);
    // Compiled here, where a fault is the request's 400 (the first
    // constraint of the server also builds the vocabulary's token trie:
    // ~0.1–0.5 s on a 248k-token vocabulary).
    let constraint = match &output {
        Some(o) => Some(crate::structured::compile(&*st.constraints()?, o)?),
        None => None,
    };
    let mut stop = req.stop;
    stop.extend(extra_stops);
    Ok(Job {
        prompt,
        marks,
        params: req.params,
        max_tokens,
        stop,
        stop_at_eos: !req.ignore_eos,
        n: req.n,
        logprobs: req.logprobs,
        stream: req.stream,
        parser,
        constraint,
    })
}

/// The prompt plus the completion must fit the context; an absent
/// `max_tokens` takes `default` (or what is left) within it.
fn token_limit(
    n_prompt: usize,
    requested: Option<u64>,
    default: Option<usize>,
    n_ctx: usize,
    param: &'static str,
) -> Result<usize, ApiError> {
    let too_long = |want: u64| {
        ApiError::bad_request(format!(
            "This model's maximum context length is {n_ctx} tokens. However, you requested {} tokens ({n_prompt} in the prompt, {want} for the completion). Please reduce the prompt or the completion length.",
            (n_prompt as u64).saturating_add(want)
        ))
        .with_param(param)
        .with_code("context_length_exceeded")
    };
    if n_prompt > n_ctx {
        return Err(too_long(0).with_param("prompt"));
    }
    let left = n_ctx - n_prompt;
    match requested {
        Some(m) if m > left as u64 => Err(too_long(m)),
        Some(m) => Ok(m as usize),
        None => Ok(default.map_or(left, |d| d.min(left))),
    }
}

fn completion_prompt(st: &ServerState, prompt: &Prompt) -> Result<Vec<u32>, ApiError> {
    let bad = |m: &str| ApiError::bad_request(m).with_param("prompt");
    let tokens = match prompt {
        Prompt::Text(t) => st.tokenizer.encode_with(
            t,
            EncodeOptions {
                add_special: true,
                parse_special: true,
            },
        ),
        Prompt::Tokens(v) => v.clone(),
    };
    let n_vocab = st.scheduler.n_vocab;
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        return Err(bad(&format!(
            "token id {t} is outside the vocabulary of {n_vocab}"
        )));
    }
    if tokens.is_empty() {
        return Err(bad("the prompt is empty"));
    }
    Ok(tokens)
}

/// Renders chat messages with the template and tokenizes them (special
/// token texts become their tokens; BOS is added when the vocabulary asks
/// for it and the template did not write it).
pub fn chat_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    vars: &TemplateVars,
) -> Result<Vec<u32>, ApiError> {
    let text = render_chat(template, messages, vars)?;
    Ok(encode_rendered(template, tokenizer, &text))
}

/// The prompt text of a chat (with the assistant's header); a template
/// that fails is the request's fault (400), naming the message and line.
pub fn render_chat(
    template: &ChatTemplate,
    messages: &[Value],
    vars: &TemplateVars,
) -> Result<String, ApiError> {
    template
        .render(messages, vars, true)
        .map_err(|e| ApiError::bad_request(e.to_string()).with_param("messages"))
}

/// Tokenizes a rendered chat text: special token texts become their
/// tokens; BOS is added when the vocabulary asks for it and the template
/// did not write it.
pub fn encode_rendered(template: &ChatTemplate, tokenizer: &Tokenizer, text: &str) -> Vec<u32> {
    let has_bos = !template.bos_token.is_empty() && text.starts_with(&template.bos_token);
    tokenizer.encode_with(
        text,
        EncodeOptions {
            add_special: !has_bos,
            parse_special: true,
        },
    )
}

/// Where the first message (the system prompt, typically) and the
/// next-to-last message end in `prompt`: checkpoints there let a later
/// conversation that shares them and then differs (same system prompt,
/// another question; the last message edited) resume at them. Positions
/// are the tokens a prefix of the conversation, rendered alone, shares
/// with the whole prompt.
pub fn message_ends(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[Value],
    vars: &TemplateVars,
    prompt: &[u32],
) -> Vec<usize> {
    let n = messages.len();
    let mut ks = vec![1, n.saturating_sub(1)];
    ks.retain(|&k| k > 0 && k < n);
    ks.dedup();
    let mut marks = Vec::new();
    for k in ks {
        let Ok(text) = template.render(&messages[..k], vars, false) else {
            continue;
        };
        let toks = encode_rendered(template, tokenizer, &text);
        let common = toks.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        if common > 0 {
            marks.push(common);
        }
    }
    marks
}
