//! The model's vocabulary as llguidance sees it: every token's bytes in a
//! token trie, control tokens marked special (their text after the 0xFF
//! marker, so that a Lark grammar can name them as `<|im_end|>`), and the
//! end-of-generation tokens as its EOS set.

use crate::tokenizer::{TokenType, Tokenizer};
use llguidance::toktrie::{TokRxInfo, TokTrie, TokenId, TokenizerEnv, INVALID_TOKEN};
use std::sync::Arc;

pub(super) struct CoilTokEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl CoilTokEnv {
    pub(super) fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let n = tokenizer.n_vocab();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| match tokenizer.vocab().token_type(id) {
                TokenType::Control | TokenType::Unknown => {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.token_to_bytes_with(id, true));
                    w
                }
                _ => tokenizer.token_to_bytes(id).to_vec(),
            })
            .collect();
        let eog = tokenizer.eog_ids();
        let eos = eog
            .first()
            .copied()
            .or(tokenizer.eos_id())
            .unwrap_or(INVALID_TOKEN);
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = tokenizer.bos_id();
        let mut trie = TokTrie::from(&info, &words);
        let eos_set: Vec<TokenId> = eog.iter().copied().filter(|&t| (t as usize) < n).collect();
        if !eos_set.is_empty() {
            trie = trie.with_eos_tokens(&eos_set);
        }
        CoilTokEnv { trie, tokenizer }
    }
}

impl TokenizerEnv for CoilTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie
            .tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text, false))
    }
}
