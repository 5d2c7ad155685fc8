// Third-party failure-scenario suite 69: an outside team's gateway suite on the managed routes the earlier suites
// drove least, written from the README ("Paths", "Streaming", "Failover and API families") and driven as a user would:
// the official `openai` 6.x SDK over real HTTP on 127.0.0.1, against the bundled mock provider and scripted upstreams
// (test/helpers/scripted-upstreams.ts) that replay a provider's exact framing.
// Checked first, and found as the README says (already covered elsewhere, so not repeated here): embeddings with a
// string, a list, token lists, the SDK's default base64 passed byte for byte and `dimensions` (suites 9, 44, 65);
// bodies over bodyLimitBytes answered 413 in the OpenAI shape (9, 54); 429/503 wait hints retried on embeddings and
// completions with x-stormgate-attempts and the metrics (44, 58, 63); an Anthropic target on /v1/embeddings or
// /v1/completions refused at start-up (config-load); legacy completion streams with [DONE], echo, logprobs, suffix,
// n > 1, a first-token timeout failed over, an abort with no ghost attempt (44, 58); GET /v1/models with aliases, globs
// and several providers, each model once, and models.retrieve() of ids with `/` and `:` (fine-tuned models), a 404
// model_not_found and a 405 for models.delete() in the OpenAI error shape (models, sdk-surfaces).
// Found here, and fixed (src/streaming/stream-events.ts streamShapeOf): a legacy completion of a BATCH of prompts
// (`prompt` a list of strings or of token lists: one stream, `n` choices for each prompt, indexed prompt × n + k) was
// taken for an answer of `n` choices. The first prompt's finish_reason made it "finished": a second prompt whose text
// came more than a second later was cut off with a clean [DONE] (the gateway's wait for a missing [DONE]), and a
// stream cut while the second prompt ran reached the SDK as a whole answer, that prompt's completion half there or
// missing, with no error.
// Bounds are generous: a loaded 2-core machine.
import OpenAI from 'openai';
import { describe, expect, it } from 'vitest';
import { DONE, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams } from './helpers/scripted-upstreams.ts';

const startUpstreams = useScriptedUpstreams();

const MODEL = 'gpt-3.5-turbo-instruct';

/** One legacy completion chunk of choice `index`, as OpenAI (and vLLM) stream a batch: each choice by its own index. */
const chunk = (index: number, text: string, finish: string | null) =>
  `data: ${JSON.stringify({ id: 'cmpl-batch', object: 'text_completion', created: 1741290958, model: MODEL, choices: [{ index, text, logprobs: null, finish_reason: finish }] })}\n\n`;

/** A gateway whose /v1/completions route goes to one scripted upstream playing `script` to every request. */
async function completionsServedBy(script: () => Script) {
  return startUpstreams({ up: script }, [{ provider: 'up' }], { path: '/v1/completions' });
}

/** Reads an SDK completion stream to its end: each choice's text and finish_reason by index, and the error it raised. */
async function readChoices(stream: AsyncIterable<OpenAI.Completion>) {
  const texts: string[] = [];
  const finishes: Array<string | null> = [];
  let err: InstanceType<typeof OpenAI.APIError> | undefined;
  try {
    for await (const c of stream) {
      for (const ch of c.choices) {
        texts[ch.index] = (texts[ch.index] ?? '') + ch.text;
        finishes[ch.index] ??= null;
        if (ch.finish_reason) finishes[ch.index] = ch.finish_reason;
      }
    }
  } catch (e) {
    err = e as InstanceType<typeof OpenAI.APIError>;
  }
  return { texts, finishes, err };
}

const PROMPTS = ['The capital of France is', 'The capital of Italy is'];

describe('a legacy completion of a batch of prompts, streamed: one choice per prompt (and per n)', () => {
  it('reaches the SDK whole when the second prompt\'s text comes more than a second after the first prompt finished', async () => {
    // The second prompt's completion is slower: its first token 1.6 s after the first one's finish, well within idleMs (5 s).
    const g = await completionsServedBy(() => ({ steps: [chunk(0, ' Paris', null), chunk(0, '.', 'stop'), 1_600, chunk(1, ' Rome', null), chunk(1, '.', 'stop'), DONE] }));
    const { texts, finishes, err } = await readChoices(await g.client.completions.create({ model: MODEL, prompt: PROMPTS, stream: true }));
    expect(err).toBeUndefined();
    expect(texts).toEqual([' Paris.', ' Rome.']);
    expect(finishes).toEqual(['stop', 'stop']);
    expect(g.seen.up).toHaveLength(1);
  });

  it('raises stream_interrupted in the SDK when the stream is cut after the first prompt finished, the second still running', async () => {
    const g = await completionsServedBy(() => ({ steps: [chunk(0, ' Paris', null), chunk(1, ' Ro', null), chunk(0, '.', 'stop'), 50, { destroy: true }] }));
    const { texts, finishes, err } = await readChoices(await g.client.completions.create({ model: MODEL, prompt: PROMPTS, stream: true }));
    expect(err).toBeInstanceOf(OpenAI.APIError);
    expect(err?.code).toBe('stream_interrupted');
    expect(texts).toEqual([' Paris.', ' Ro']);
    expect(finishes).toEqual(['stop', null]);
    // Output had gone out: nothing is sent again.
    expect(g.seen.up).toHaveLength(1);
  });

  it('ends token-list prompts with n: 2 (four choices) with a [DONE] within seconds once all four finished and the server went quiet', async () => {
    const steps = [0, 1, 2, 3].map((i) => chunk(i, `answer ${i}`, 'stop'));
    const g = await completionsServedBy(() => ({ steps, hold: true }));
    const t0 = Date.now();
    const stream = await g.client.completions.create({ model: MODEL, prompt: [[791, 6864], [791, 6864, 315]], n: 2, stream: true });
    const { texts, finishes, err } = await readChoices(stream);
    expect(err).toBeUndefined();
    expect(Date.now() - t0).toBeLessThan(4_500);
    expect(texts).toEqual(['answer 0', 'answer 1', 'answer 2', 'answer 3']);
    expect(finishes).toEqual(['stop', 'stop', 'stop', 'stop']);
  });

  it('counts one token-list prompt (a list of numbers) as one prompt: its finish, then silence, ends it with a [DONE] within seconds', async () => {
    const g = await completionsServedBy(() => ({ steps: [chunk(0, ' Paris', null), chunk(0, '.', 'stop')], hold: true }));
    const t0 = Date.now();
    const { texts, err } = await readChoices(await g.client.completions.create({ model: MODEL, prompt: [791, 6864, 315, 9822, 374], stream: true }));
    expect(err).toBeUndefined();
    expect(Date.now() - t0).toBeLessThan(4_500);
    expect(texts).toEqual([' Paris.']);
  });
});
