//! The step's token budget: how many tokens each running request feeds
//! the next forward pass.
//!
//! Every generating request feeds its sampled token in every step, so no
//! generation stalls while prompts go in; prompts take what the budget
//! leaves, first come first served, in chunks, but never less than a
//! quarter of the budget, so a prompt also progresses however many
//! requests generate. A step then costs at most about `step_tokens`
//! tokens' worth of compute, which bounds the time per output token of the
//! generating requests while a long prompt is admitted, and a prompt of P
//! tokens gets its first token after about P / (the prompt share) steps.

/// What a running request needs from the next step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Need {
    /// Its last sampled token (one token).
    Token,
    /// Prompt tokens, at most this many in this call (up to where a
    /// checkpoint must land: a mark, or before the prompt's last token).
    Prompt(usize),
    /// Nothing (waiting for nothing the step can give).
    Idle,
}

/// The share of a step's `step_tokens` budget left to prompts beside
/// `n_generating` generated tokens: the rest, but at least a quarter.
pub(super) fn prompt_share(step_tokens: usize, n_generating: usize) -> usize {
    step_tokens
        .saturating_sub(n_generating)
        .max(step_tokens.div_ceil(4))
}

/// Tokens each request feeds the next step (0: none), in `needs`' order,
/// which is the order requests arrived in.
pub(super) fn split(step_tokens: usize, needs: &[Need]) -> Vec<usize> {
    let n_generating = needs.iter().filter(|n| **n == Need::Token).count();
    let mut left = prompt_share(step_tokens, n_generating);
    needs
        .iter()
        .map(|n| match *n {
            Need::Token => 1,
            Need::Prompt(want) => {
                let take = want.min(left);
                left -= take;
                take
            }
            Need::Idle => 0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs steps until prompt `p` is all in: returns the steps taken and
    /// the tokens each generating request fed meanwhile.
    fn admit(step_tokens: usize, n_generating: usize, prompts: &[usize]) -> (Vec<usize>, usize) {
        let mut left: Vec<usize> = prompts.to_vec();
        let mut done_at = vec![0; prompts.len()];
        let mut fed = 0;
        let mut step = 0;
        while left.iter().any(|&l| l > 0) {
            step += 1;
            let mut needs = vec![Need::Token; n_generating];
            needs.extend(
                left.iter()
                    .map(|&l| if l > 0 { Need::Prompt(l) } else { Need::Idle }),
            );
            let got = split(step_tokens, &needs);
            assert!(
                got[..n_generating].iter().all(|&g| g == 1),
                "a generation stalled"
            );
            fed += 1;
            let total: usize = got.iter().sum();
            assert!(
                total <= step_tokens.max(n_generating + step_tokens.div_ceil(4)),
                "step {step} took {total} tokens"
            );
            for (i, g) in got[n_generating..].iter().enumerate() {
                left[i] -= g;
                if left[i] == 0 && *g > 0 {
                    done_at[i] = step;
                }
            }
            assert!(step < 10_000, "a prompt starved");
        }
        (done_at, fed)
    }

    #[test]
    fn generations_feed_every_step_while_a_long_prompt_goes_in() {
        // 8 generating, a 1000-token prompt, 64 tokens a step: 56 prompt
        // tokens a step, so 18 steps, each with a token for all 8.
        let (done, fed) = admit(64, 8, &[1000]);
        assert_eq!(done, vec![18]);
        assert_eq!(fed, 18);
    }

    #[test]
    fn prompts_progress_however_many_requests_generate() {
        // 100 generating beside a 64-token budget: prompts still get 16.
        assert_eq!(prompt_share(64, 100), 16);
        let (done, _) = admit(64, 100, &[160]);
        assert_eq!(done, vec![10]);
    }

    #[test]
    fn prompts_go_in_first_come_first_served() {
        // The first prompt takes the budget; the second starts on what is
        // left in the first's last step.
        let got = split(64, &[Need::Token, Need::Prompt(40), Need::Prompt(100)]);
        assert_eq!(got, vec![1, 40, 23]);
        let (done, _) = admit(64, 0, &[100, 100, 100]);
        assert_eq!(done, vec![2, 4, 5]);
        assert_eq!(split(8, &[Need::Idle, Need::Prompt(3)]), vec![0, 3]);
    }
}
