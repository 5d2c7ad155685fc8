// Third-party failure-scenario suite 77: the SHAPES of chat completion stream chunks that real providers send, and
// that the gateway's stream logic (first-output detection, finish tracking, [DONE] handling, cut detection, stream
// recovery) reads. Written from the README ("Streaming", "Deadlines and timeouts" on firstTokenMs, "Failover and API
// families" on what an Anthropic target cannot express) and the providers' documentation of the wire:
//  - OpenAI chat completions streaming with `n` > 1: every choice's role chunk first, then chunks of one choice each,
//    keyed by `index`, interleaved; each choice ends with its own `finish_reason`, then one `data: [DONE]`.
//  - `stream_options.include_usage`: `"usage": null` on every chunk, then a last chunk with `"choices": []` and the
//    usage; `stream_options.include_obfuscation` (on by default since 2025): an `obfuscation` string on every chunk.
//  - Azure OpenAI: a first chunk with `"choices": []` and `prompt_filter_results` (id, model, object empty), a
//    `content_filter_results` object on every choice, and, with its asynchronous filter, annotation chunks after the
//    text (a choice with no `delta`, `content_filter_offsets`) and a mid-stream `finish_reason: "content_filter"`.
//  - `logprobs: true`: each choice carries `logprobs: {content: [...], refusal: null}`; a refusal streams as
//    `delta.refusal` fragments (the role chunk carries `"refusal": null`).
//  - Compatible servers that send usage on every chunk, and `delta: {content: ""}` chunks as keep-alives.
// Driven with the official `openai` 6.x SDK and plain fetch (for the exact bytes) over real HTTP on 127.0.0.1, against
// node:http upstreams of the suite's own (test/helpers/scripted-upstreams.ts) that send exactly those bytes.
// What the earlier suites (answer-progress, live-stream, stream-usage, azure-openai, chat-wire, failover-fidelity and
// others) leave out, and this suite checks through whole streams:
//  1. n: 2 interleaved with finishes at different times: passed on byte for byte; a close (clean, or reset) after one
//     choice's finish while the other runs (its text begun, or only its role chunk) is a cut, never [DONE]; both
//     finished and no [DONE] gets one; n: 2 on a route with streamRecovery ends with the error, the backup never asked;
//     n: 2 non-streamed and streamed, failed over past a primary's 503s to an Anthropic backup: skipped, not tried.
//  2. include_usage: OpenAI's shape (usage null, obfuscation, the usage chunk) byte for byte; a compatible server's
//     usage on every chunk and no usage chunk: ends a second after the finish, not idleMs; a close after the finish
//     and before the usage chunk.
//  3. Azure: the prompt filter chunk (choices: []) and empty role chunk before the text neither release the headers nor
//     stop the first-token timer; annotation chunks after the text and a mid-stream content_filter finish pass as sent,
//     neither retried nor failed over.
//  4. refusal as the first output releases the headers and starts idleMs; logprobs chunks after a retried 503.
//  5. empty-content keep-alives: before the first output they do not stop firstTokenMs (the attempt times out and is
//     retried); after it they keep idleMs from firing, as any event does.
// Found here: no gateway bug; every scenario behaves as the README says. Seen on the client side: the openai SDK's
// stream() helper throws (TypeError on `delta.content`) on Azure's asynchronous-filter annotation chunk, whose choice
// has no `delta`; the gateway passes it on as Azure sent it, and a raw `create({ stream: true })` reader is fine.
// Design questions, not built: an n: 2 stream whose upstream sends `data: [DONE]` after choice 0's finish while choice 1
// is mid-text (no event dropped) is passed on as a clean end (the SDK helper refuses it, "missing finish_reason for
// choice 1"; raw readers take one and a half answers), as suite 75 found for [DONE] inside a tool call's arguments; and
// a close or reset after every finish but before the usage chunk the client asked for (include_usage) gets [DONE]
// with no usage chunk, so the client cannot tell "no usage sent" from "usage lost".
// Bounds are generous: a loaded 2-core machine.
import { describe, expect, it } from 'vitest';
import { sdkError } from './helpers/openai-error.ts';
import { cc, delta, DONE, json, type Script } from './helpers/scripted-provider.ts';
import { useScriptedUpstreams, type UpstreamsGateway } from './helpers/scripted-upstreams.ts';

const gw = useScriptedUpstreams();
const messages = [{ role: 'user' as const, content: 'Name a colour.' }];
const sse = (steps: Script['steps']): Script => ({ steps });
const retries3 = { retry: { maxAttempts: 3, backoff: { strategy: 'fixed' as const, baseMs: 5, capMs: 5 } } };

/** OpenAI's role chunk for choice `i` (content "", refusal null), as it opens every choice of an n > 1 stream. */
const role = (i: number) => cc([delta({ role: 'assistant', content: '', refusal: null }, null, i)]);
const text = (i: number, t: string) => cc([delta({ content: t }, null, i)]);
const fin = (i: number, why = 'stop') => cc([delta({}, why, i)]);

/** POSTs a stream request with fetch and returns the status, headers, the whole body and when the headers came. */
async function raw(g: UpstreamsGateway, body: Record<string, unknown>): Promise<{ status: number; headers: Headers; text: string; headersMs: number; totalMs: number }> {
  const t0 = Date.now();
  const r = await fetch(`${g.s.baseURL}/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-client' },
    body: JSON.stringify({ model: 'gpt-4o', messages, stream: true, ...body }),
  });
  const headersMs = Date.now() - t0;
  const out = await r.text();
  return { status: r.status, headers: r.headers, text: out, headersMs, totalMs: Date.now() - t0 };
}

/** The data of each event of a raw SSE text, in order. */
const dataOf = (s: string) => s.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice('data: '.length));
const lastError = (s: string) => (JSON.parse(dataOf(s).at(-1)!) as { error?: { code?: string; message?: string } }).error;

describe('n: 2 streamed: choices interleaved by index, each finishing on its own', () => {
  const interleaved = [role(0), role(1), text(1, 'Blue'), text(0, 'Red'), text(0, ' wine'), fin(0), text(1, ' sky'), 150, fin(1, 'length')];

  it('passes every chunk on byte for byte, and the SDK gets both choices with their own finish_reason', async () => {
    const g = await gw({ a: () => sse([...interleaved, DONE]) }, [{ provider: 'a' }]);
    const r = await raw(g, { n: 2 });
    expect(r.status).toBe(200);
    expect(r.headers.get('x-stormgate-attempts')).toBe('1');
    expect(r.text).toBe([...interleaved.filter((s) => typeof s === 'string'), DONE].join(''));
    const final = await g.client.chat.completions.stream({ model: 'gpt-4o', messages, n: 2 }).finalChatCompletion();
    expect(final.choices.map((c) => [c.index, c.message.content, c.finish_reason])).toEqual([
      [0, 'Red wine', 'stop'],
      [1, 'Blue sky', 'length'],
    ]);
    expect(g.seen.a).toHaveLength(2);
    expect(g.seen.a![0]!.body.n).toBe(2);
  });

  it('choice 0 finished, choice 1 mid-text, then a clean close without [DONE]: a cut (error event), not a made-up [DONE]', async () => {
    const g = await gw({ a: () => sse([role(0), role(1), text(0, 'Red'), fin(0), text(1, 'Blu')]) }, [{ provider: 'a' }], { route: retries3 });
    const r = await raw(g, { n: 2 });
    expect(r.text).not.toContain('[DONE]');
    expect(lastError(r.text)?.code).toBe('stream_interrupted');
    // Never retried: the client had its first bytes.
    expect(g.seen.a).toHaveLength(1);
    const err = await sdkError(g.client.chat.completions.stream({ model: 'gpt-4o', messages, n: 2 }).finalChatCompletion());
    expect(err.code).toBe('stream_interrupted');
    expect(g.seen.a).toHaveLength(2);
  });

  it('choice 1 only announced (its role chunk, no text yet) when the upstream closes after choice 0\'s finish: a cut too', async () => {
    const g = await gw({ a: () => sse([role(0), role(1), text(0, 'Red'), fin(0)]) }, [{ provider: 'a' }]);
    const r = await raw(g, { n: 2 });
    expect(r.text).not.toContain('[DONE]');
    expect(lastError(r.text)?.code).toBe('stream_interrupted');
  });

  it('choice 0 finished and a reset while choice 1 runs: a cut; the same reset after both finished gets [DONE]', async () => {
    const g = await gw(
      {
        a: (_b, n) => sse(n === 1 ? [role(0), role(1), text(0, 'Red'), fin(0), text(1, 'Blu'), 50, { destroy: true }] : [role(0), role(1), text(0, 'Red'), fin(0), text(1, 'Blue'), fin(1), 50, { destroy: true }]),
      },
      [{ provider: 'a' }],
    );
    const cut = await raw(g, { n: 2 });
    expect(cut.text).not.toContain('[DONE]');
    expect(lastError(cut.text)?.code).toBe('stream_interrupted');
    const whole = await raw(g, { n: 2 });
    expect(whole.text.endsWith(DONE)).toBe(true);
    expect(whole.text).not.toContain('"error"');
  });

  it('both choices finished and the upstream closes without [DONE]: [DONE] is added, within about a second', async () => {
    const g = await gw({ a: () => ({ ...sse([role(0), role(1), text(0, 'Red'), text(1, 'Blue'), fin(1), fin(0)]), hold: true }) }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 8_000 } },
    });
    const r = await raw(g, { n: 2 });
    expect(r.text.endsWith(DONE)).toBe(true);
    expect(r.text).not.toContain('"error"');
    // Held open after the finishes: the gateway's second, not idleMs (8 s).
    expect(r.totalMs).toBeLessThan(5_000);
  });

  it('on a route with streamRecovery: continue, a cut n: 2 stream ends with its error event; the backup is never asked', async () => {
    const g = await gw(
      {
        // (The reset waits a moment: one right after the writes can take their bytes with it, a break before any output.)
        a: () => sse([role(0), role(1), text(0, 'Red'), fin(0), text(1, 'Blu'), 100, { destroy: true }]),
        b: () => sse([role(0), role(1), text(0, 'Red'), fin(0), text(1, 'Blue'), fin(1), DONE]),
      },
      [{ provider: 'a' }, { provider: 'b' }],
      { route: { streamRecovery: 'continue', retry: { maxAttempts: 1 } } },
    );
    const r = await raw(g, { n: 2 });
    expect(lastError(r.text)?.code).toBe('stream_interrupted');
    expect(r.text).not.toContain('stormgate stream recovered');
    expect(g.seen.a).toHaveLength(1);
    expect(g.seen.b).toHaveLength(0);
  });
});

describe('n: 2 failed over past the primary\'s 503s to an Anthropic backup (which has no n)', () => {
  const down = () => json(503, { error: { message: 'The server is overloaded', type: 'server_error', param: null, code: null } });
  const claude = () => json(200, { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-sonnet-4-6', content: [{ type: 'text', text: 'Red' }], stop_reason: 'end_turn', stop_sequence: null, usage: { input_tokens: 5, output_tokens: 1 } });

  for (const stream of [false, true]) {
    it(`${stream ? 'streamed' : 'whole'}: the backup is skipped, never sent one choice for two; the client gets the primary's 503 naming it as not tried`, async () => {
      const g = await gw({ a: down, c: { family: 'anthropic', answer: claude } }, [{ provider: 'a' }, { provider: 'c', model: 'claude-sonnet-4-6' }]);
      const err = await sdkError(g.client.chat.completions.create({ model: 'gpt-4o', messages, n: 2, stream } as never));
      expect(err.status).toBe(503);
      expect(err.message).toMatch(/not tried: c\/claude-sonnet-4-6 \(.*n > 1/);
      expect(err.headers?.get('x-stormgate-attempts')).toBe('2');
      expect(err.headers?.get('x-should-retry')).toBe('false');
      expect(g.seen.a).toHaveLength(2);
      expect(g.seen.c).toHaveLength(0);
    });
  }
});

describe('stream_options.include_usage and obfuscation', () => {
  const ob = { usage: null, obfuscation: 'k2Xq' };
  const usageChunk = cc([], { usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11, prompt_tokens_details: { cached_tokens: 0, audio_tokens: 0 }, completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 0, accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 } }, obfuscation: 'Zr' });
  const openaiShape = [
    cc([delta({ role: 'assistant', content: '', refusal: null })], ob),
    cc([delta({ content: 'Red' })], { ...ob, obfuscation: 'aB3dE' }),
    cc([delta({ content: '.' })], { ...ob, obfuscation: 'q' }),
    cc([delta({}, 'stop')], { ...ob, obfuscation: 'xYz0' }),
    usageChunk,
    DONE,
  ];

  it('OpenAI\'s shape (usage null and obfuscation on every chunk, the choices: [] usage chunk) reaches the client byte for byte', async () => {
    const g = await gw({ a: () => sse(openaiShape) }, [{ provider: 'a' }]);
    const r = await raw(g, { stream_options: { include_usage: true } });
    expect(r.text).toBe(openaiShape.join(''));
    const chunks = [];
    for await (const c of await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } })) chunks.push(c);
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? '').join('')).toBe('Red.');
    expect(chunks.at(-1)!.choices).toEqual([]);
    expect(chunks.at(-1)!.usage?.total_tokens).toBe(11);
  });

  it('obfuscation and usage: null on keep-alive chunks (role, empty content) do not release the headers: the text does', async () => {
    const g = await gw(
      { a: () => sse([cc([delta({ role: 'assistant', content: '', refusal: null })], ob), 200, cc([delta({ content: '' })], ob), 200, cc([delta({ content: '' })], ob), 300, ...openaiShape.slice(1)]) },
      [{ provider: 'a' }],
    );
    const r = await raw(g, { stream_options: { include_usage: true } });
    expect(r.headersMs).toBeGreaterThanOrEqual(600);
    expect(r.headers.get('x-stormgate-attempts')).toBe('1');
    // Held, not dropped: the keep-alives go out with the first output, in order.
    expect(dataOf(r.text).filter((d) => d.includes('"obfuscation"'))).toHaveLength(7);
  });

  it('a compatible server\'s usage on every chunk and no usage chunk, never [DONE]: ends a second after the finish, not idleMs; the client keeps each chunk\'s usage', async () => {
    let tokens = 0;
    const withUsage = (d: Record<string, unknown>, finish: string | null = null) => cc([delta(d, finish)], { usage: { prompt_tokens: 9, completion_tokens: ++tokens, total_tokens: 9 + tokens } });
    const g = await gw({ a: () => ({ ...sse([withUsage({ role: 'assistant', content: '' }), withUsage({ content: 'Red' }), withUsage({}, 'stop')]), hold: true }) }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 5_000, idleMs: 8_000 } },
    });
    const r = await raw(g, { stream_options: { include_usage: true } });
    expect(r.totalMs).toBeLessThan(5_000);
    expect(r.text.endsWith(DONE)).toBe(true);
    expect(dataOf(r.text).filter((d) => d.includes('"usage":{'))).toHaveLength(3);
  });

  it('a close after the finish chunk and before the usage chunk the client asked for: [DONE] is added (every choice finished), with no usage chunk made up', async () => {
    const g = await gw({ a: () => sse(openaiShape.slice(0, 4)) }, [{ provider: 'a' }]);
    const chunks = [];
    for await (const c of await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true, stream_options: { include_usage: true } })) chunks.push(c);
    expect(chunks.at(-1)!.choices[0]!.finish_reason).toBe('stop');
    expect(chunks.some((c) => c.usage)).toBe(false);
    const r = await raw(g, { stream_options: { include_usage: true } });
    expect(r.text).toBe([...openaiShape.slice(0, 4), DONE].join(''));
  });
});

describe('Azure OpenAI: prompt filter chunk, content filter results, annotations after the text, a content_filter finish', () => {
  const cfr = { hate: { filtered: false, severity: 'safe' }, self_harm: { filtered: false, severity: 'safe' }, sexual: { filtered: false, severity: 'safe' }, violence: { filtered: false, severity: 'safe' } };
  const azure = (choices: unknown[], extra: Record<string, unknown> = {}) =>
    `data: ${JSON.stringify({ choices, created: 1741290958, id: 'chatcmpl-Az1', model: 'gpt-4o-2024-11-20', object: 'chat.completion.chunk', system_fingerprint: 'fp_az', ...extra })}\n\n`;
  const promptFilter = `data: ${JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [{ prompt_index: 0, content_filter_results: cfr }] })}\n\n`;
  const azRole = azure([{ content_filter_results: {}, delta: { content: '', refusal: null, role: 'assistant' }, finish_reason: null, index: 0, logprobs: null }]);
  const azText = (t: string) => azure([{ content_filter_results: cfr, delta: { content: t }, finish_reason: null, index: 0, logprobs: null }]);
  const azFinish = (why: string) => azure([{ content_filter_results: {}, delta: {}, finish_reason: why, index: 0, logprobs: null }]);
  /** The asynchronous filter's annotation: a choice with no delta, its offsets and results. */
  const annotation = (results: Record<string, unknown>, finish: string | null = null) =>
    `data: ${JSON.stringify({ choices: [{ content_filter_offsets: { check_offset: 0, start_offset: 0, end_offset: 9 }, content_filter_results: results, finish_reason: finish, index: 0 }], created: 0, id: '', model: '', object: '' })}\n\n`;
  const azOpts = { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 900, idleMs: 3_000 } }, route: retries3 };

  it('the prompt filter chunk and the empty role chunk before slow text: headers held until the text, every byte kept, one attempt', async () => {
    const steps = [promptFilter, azRole, 500, azText('Red'), azText(' wine'), azFinish('stop'), 100, annotation(cfr), DONE];
    const g = await gw({ z: { family: 'azure-openai', answer: () => sse(steps) } }, [{ provider: 'z', model: 'gpt4o-deploy' }], azOpts);
    const r = await raw(g, {});
    expect(r.headersMs).toBeGreaterThanOrEqual(450);
    expect(r.text).toBe(steps.filter((s) => typeof s === 'string').join(''));
    expect(r.headers.get('x-stormgate-attempts')).toBe('1');
    expect(g.seen.z![0]!.url).toContain('/openai/deployments/gpt4o-deploy/chat/completions');
  });

  it('prompt filter and role chunks repeated past firstTokenMs with no text: the attempt times out and is retried', async () => {
    const stalling = [promptFilter, azRole, 400, azText(''), 400, azText(''), 400, azText(''), 400, azText('late')];
    const g = await gw({ z: { family: 'azure-openai', answer: (_b, n) => sse(n === 1 ? stalling : [promptFilter, azRole, azText('Red'), azFinish('stop'), DONE]) } }, [{ provider: 'z', model: 'gpt4o-deploy' }], azOpts);
    const r = await raw(g, {});
    expect(r.headers.get('x-stormgate-attempts')).toBe('2');
    expect(r.text).not.toContain('late');
    expect(dataOf(r.text).filter((d) => d.includes('prompt_filter_results'))).toHaveLength(1);
    expect(g.seen.z).toHaveLength(2);
  });

  it('a mid-stream finish_reason "content_filter" (the asynchronous filter\'s verdict after the text) reaches the client as sent: no retry, no failover, no error', async () => {
    const violation = { ...cfr, violence: { filtered: true, severity: 'high' } };
    const steps = [promptFilter, azRole, azText('Here is how'), azText(' to'), 200, annotation(violation, 'content_filter'), DONE];
    const g = await gw(
      { z: { family: 'azure-openai', answer: () => sse(steps) }, b: () => sse([role(0), text(0, 'Other'), fin(0), DONE]) },
      [{ provider: 'z', model: 'gpt4o-deploy' }, { provider: 'b' }],
      azOpts,
    );
    const r = await raw(g, {});
    expect(r.text).toBe(steps.filter((s) => typeof s === 'string').join(''));
    // Read raw: the SDK's stream() helper throws on the annotation's choice without a delta (the SDK's, not the gateway's).
    let content = '';
    let finish: string | null = null;
    for await (const c of await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true })) {
      const choice = c.choices[0];
      content += choice?.delta?.content ?? '';
      finish = choice?.finish_reason ?? finish;
    }
    expect(finish).toBe('content_filter');
    expect(content).toBe('Here is how to');
    expect(g.seen.z).toHaveLength(2);
    expect(g.seen.b).toHaveLength(0);
  });

  it('a content_filter finish as the very first chunk (the filter tripped on the first buffered text): the client\'s empty answer, neither retried nor failed over', async () => {
    const steps = [promptFilter, azRole, annotation({ ...cfr, sexual: { filtered: true, severity: 'medium' } }, 'content_filter'), DONE];
    const g = await gw({ z: { family: 'azure-openai', answer: () => sse(steps) }, b: () => sse([role(0), text(0, 'Other'), fin(0), DONE]) }, [{ provider: 'z', model: 'gpt4o-deploy' }, { provider: 'b' }], azOpts);
    const r = await raw(g, {});
    expect(r.status).toBe(200);
    expect(r.headers.get('x-stormgate-attempts')).toBe('1');
    expect(r.headers.get('x-stormgate-fallback')).toBeNull();
    expect(r.text).toBe(steps.join(''));
    expect(g.seen.z).toHaveLength(1);
    expect(g.seen.b).toHaveLength(0);
  });

  it('the filter\'s late verdict after a "stop" finish (1.5 s later) is waited for on Azure, not cut off by the one-second [DONE] wait', async () => {
    const steps = [promptFilter, azRole, azText('Red'), azFinish('stop'), 1_500, annotation({ ...cfr, protected_material_text: { filtered: true, detected: true } }, 'content_filter'), DONE];
    const g = await gw({ z: { family: 'azure-openai', answer: () => sse(steps) } }, [{ provider: 'z', model: 'gpt4o-deploy' }], azOpts);
    const r = await raw(g, {});
    expect(r.text).toBe(steps.filter((s) => typeof s === 'string').join(''));
  });
});

describe('refusal and logprobs deltas', () => {
  it('a refusal as the first output releases the held headers and starts idleMs: refusal fragments past firstTokenMs are not timed out', async () => {
    const steps = [cc([delta({ role: 'assistant', content: null, refusal: null })]), 300, cc([delta({ refusal: "I'm sorry," })]), 500, cc([delta({ refusal: ' I cannot' })]), 500, cc([delta({ refusal: ' help with that.' })]), fin(0), DONE];
    const g = await gw({ a: () => sse(steps) }, [{ provider: 'a' }], { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 700, idleMs: 1_500 } }, route: retries3 });
    const t0 = Date.now();
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    expect(Date.now() - t0).toBeLessThan(1_000);
    expect(response.headers.get('x-stormgate-attempts')).toBe('1');
    const parts: string[] = [];
    for await (const c of stream) parts.push(c.choices[0]?.delta.refusal ?? '');
    expect(parts.join('')).toBe("I'm sorry, I cannot help with that.");
    expect(Date.now() - t0).toBeGreaterThan(1_100);
    expect(g.seen.a).toHaveLength(1);
  });

  it('a reset right after the refusal began is the client\'s error event: never retried, never a clean end', async () => {
    const g = await gw({ a: () => sse([cc([delta({ role: 'assistant', content: null, refusal: null })]), cc([delta({ refusal: "I'm sorry" })]), 100, { destroy: true }]) }, [{ provider: 'a' }], { route: retries3 });
    const r = await raw(g, {});
    expect(r.text).toContain("I'm sorry");
    expect(r.text).not.toContain('[DONE]');
    expect(lastError(r.text)?.code).toBe('stream_interrupted');
    expect(g.seen.a).toHaveLength(1);
  });

  it('logprobs chunks after a retried 503: the client gets the second attempt\'s chunks only, logprobs byte for byte', async () => {
    const lp = (token: string, logprob: number) => ({ content: [{ token, logprob, bytes: [...Buffer.from(token)], top_logprobs: [{ token, logprob, bytes: [...Buffer.from(token)] }] }], refusal: null });
    const steps = [
      cc([{ index: 0, delta: { role: 'assistant', content: '', refusal: null }, logprobs: { content: [], refusal: null }, finish_reason: null }]),
      cc([{ index: 0, delta: { content: 'Red' }, logprobs: lp('Red', -0.0001234), finish_reason: null }]),
      cc([{ index: 0, delta: { content: ' é' }, logprobs: lp(' é', -1.5e-7), finish_reason: null }]),
      cc([{ index: 0, delta: {}, logprobs: null, finish_reason: 'stop' }]),
      DONE,
    ];
    const g = await gw({ a: (_b, n) => (n === 1 ? json(503, { error: { message: 'busy', type: 'server_error', param: null, code: null } }) : sse(steps)) }, [{ provider: 'a' }], { route: retries3 });
    const r = await raw(g, { logprobs: true, top_logprobs: 1 });
    expect(r.headers.get('x-stormgate-attempts')).toBe('2');
    expect(r.text).toBe(steps.join(''));
    expect(g.seen.a![1]!.body).toMatchObject({ logprobs: true, top_logprobs: 1 });
  });
});

describe('empty-content deltas as keep-alives', () => {
  it('before the first output they do not stop firstTokenMs: the attempt times out and the retry answers', async () => {
    const empties = [role(0), ...Array.from({ length: 8 }, () => [200, text(0, '')]).flat(), text(0, 'too late')];
    const g = await gw({ a: (_b, n) => sse(n === 1 ? empties : [role(0), text(0, 'Red'), fin(0), DONE]) }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 700, idleMs: 5_000 } },
      route: retries3,
    });
    const { data: stream, response } = await g.client.chat.completions.create({ model: 'gpt-4o', messages, stream: true }).withResponse();
    expect(response.headers.get('x-stormgate-attempts')).toBe('2');
    let out = '';
    for await (const c of stream) out += c.choices[0]?.delta.content ?? '';
    expect(out).toBe('Red');
    expect(g.seen.a).toHaveLength(2);
  });

  it('after the first output they are events: a stream that sends them past idleMs is not stalled', async () => {
    // 1.5 s of empty deltas 250 ms apart against idleMs 1 s: 750 ms between a delta and the timer, for a loaded CI
    // machine that can starve the gateway for a few hundred ms while the next delta waits in its socket.
    const steps = [role(0), text(0, 'Red'), ...Array.from({ length: 6 }, () => [250, text(0, '')]).flat(), text(0, ' wine'), fin(0), DONE];
    const g = await gw({ a: () => sse(steps) }, [{ provider: 'a' }], { provider: { timeouts: { connectMs: 1_000, firstTokenMs: 2_000, idleMs: 1_000 } } });
    const r = await raw(g, {});
    expect(r.text).toBe(steps.filter((s) => typeof s === 'string').join(''));
    expect(r.totalMs).toBeGreaterThan(1_200);
  });

  it('a stall after them still ends the stream with the error event the SDK raises (the empty deltas carried no output)', async () => {
    const g = await gw({ a: () => ({ ...sse([role(0), text(0, 'Red'), 200, text(0, ''), 200, text(0, '')]), hold: true }) }, [{ provider: 'a' }], {
      provider: { timeouts: { connectMs: 1_000, firstTokenMs: 2_000, idleMs: 1_000 } },
    });
    const err = await sdkError(g.client.chat.completions.stream({ model: 'gpt-4o', messages }).finalChatCompletion());
    expect(err.code).toBe('stream_interrupted');
    expect(err.message).toMatch(/stalled/);
    expect(g.seen.a).toHaveLength(1);
  });
});
