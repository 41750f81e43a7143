//! llama-server's extras, in its shapes: `POST /tokenize`,
//! `POST /detokenize` and `GET /props`.

use crate::api::{self, ApiError};
use crate::fields;
use crate::routes::ServerState;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use coil::engine::sampling::SamplingParams;
use coil::tokenizer::EncodeOptions;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize)]
struct TokenizeRequest {
    content: String,
    /// Add BOS (and EOS) as the vocabulary asks.
    #[serde(default)]
    add_special: bool,
    /// Special tokens' texts become those tokens.
    #[serde(default = "yes")]
    parse_special: bool,
    /// `[{"id", "piece"}]` in place of bare ids.
    #[serde(default)]
    with_pieces: bool,
}

fn yes() -> bool {
    true
}

/// `POST /tokenize`: `{"content", "add_special"?, "parse_special"?,
/// "with_pieces"?}` → `{"tokens": [id, ...]}`, or with pieces
/// `{"tokens": [{"id", "piece"}]}` (a piece that is not UTF-8 on its own
/// as its bytes).
pub async fn tokenize(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let run = || -> Result<Value, ApiError> {
        fields::check(
            &body,
            &[&["content", "add_special", "parse_special", "with_pieces"]],
        )?;
        let r: TokenizeRequest = api::parse_body(&body)?;
        let ids = st.tokenizer.encode_with(
            &r.content,
            EncodeOptions {
                add_special: r.add_special,
                parse_special: r.parse_special,
            },
        );
        if !r.with_pieces {
            return Ok(json!({ "tokens": ids }));
        }
        let tokens: Vec<Value> = ids
            .iter()
            .map(|&id| {
                let b = st.tokenizer.token_to_bytes_with(id, true);
                let piece = match std::str::from_utf8(b) {
                    Ok(s) => json!(s),
                    Err(_) => json!(b),
                };
                json!({ "id": id, "piece": piece })
            })
            .collect();
        Ok(json!({ "tokens": tokens }))
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    tokens: Vec<u32>,
}

/// `POST /detokenize`: `{"tokens": [id, ...]}` → `{"content": text}`.
pub async fn detokenize(State(st): State<Arc<ServerState>>, body: Bytes) -> Response {
    let run = || -> Result<Value, ApiError> {
        fields::check(&body, &[&["tokens"]])?;
        let r: DetokenizeRequest = api::parse_body(&body)?;
        let n_vocab = st.tokenizer.n_vocab();
        if let Some(t) = r.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ApiError::bad_request(format!(
                "token id {t} is outside the vocabulary of {n_vocab}"
            ))
            .with_param("tokens"));
        }
        let bytes = st.tokenizer.decode_bytes_with(&r.tokens, true);
        Ok(json!({ "content": String::from_utf8_lossy(&bytes) }))
    };
    match run() {
        Ok(v) => Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `GET /props`: the model, its context, the chat template, the build and
/// the SIMD level the kernels run at, and the sampling defaults.
pub async fn props(State(st): State<Arc<ServerState>>) -> Json<Value> {
    let d = SamplingParams::default();
    let i = &st.info;
    Json(json!({
        "model_alias": st.model_id,
        "model_path": st.model_id,
        "model": {
            "arch": i.arch,
            "name": i.name,
            "n_params": i.n_params,
            "size": i.size_bytes,
            "n_vocab": st.scheduler.n_vocab,
            "n_ctx_train": i.n_ctx_train,
            "n_embd": i.n_embd,
            "n_layer": i.n_layer,
            "layers": i.pattern,
        },
        "n_ctx": st.scheduler.n_ctx,
        "total_slots": st.scheduler.parallel,
        "default_generation_settings": {
            "n_ctx": st.scheduler.n_ctx,
            "params": {
                "temperature": d.temperature,
                "top_k": d.top_k,
                "top_p": d.top_p,
                "min_p": d.min_p,
                "typical_p": d.typical_p,
                "top_n_sigma": d.top_n_sigma,
                "xtc_probability": d.xtc_probability,
                "xtc_threshold": d.xtc_threshold,
                "repeat_penalty": d.repeat_penalty,
                "repeat_last_n": d.repeat_last_n,
                "presence_penalty": d.presence_penalty,
                "frequency_penalty": d.frequency_penalty,
                "dry_multiplier": d.dry.multiplier,
                "dry_base": d.dry.base,
                "dry_allowed_length": d.dry.allowed_length,
                "dry_penalty_last_n": d.dry.penalty_last_n,
                "dry_sequence_breakers": coil::engine::dry::DEFAULT_BREAKERS,
                "mirostat": 0,
                "mirostat_tau": d.mirostat_tau,
                "mirostat_eta": d.mirostat_eta,
            },
        },
        "chat_template": st.template.source,
        "chat_template_from_model": st.template.from_model,
        "bos_token": st.template.bos_token,
        "eos_token": st.template.eos_token,
        "build_info": format!("coil {}", env!("CARGO_PKG_VERSION")),
        "simd": coil_kernels::simd::level().name(),
        "system_info": coil_kernels::system_info(),
        "modalities": { "vision": false, "audio": false },
    }))
}
