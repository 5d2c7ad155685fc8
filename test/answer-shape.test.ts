// Which 2xx bodies are answers: judged from the bytes (no second JSON.parse on the hot path), and, for an Anthropic
// target, by the translator, which refuses anything but a message.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { notAnAnswer } from '../src/providers/answer-shape.ts';
import { prepareUpstream } from '../src/providers/families.ts';

const json = 'application/json';
type Api = Parameters<typeof notAnAnswer>[0]['api'];
const judge = (api: Api, body: string, ownFamily = true) => notAnAnswer({ api, stream: false, contentType: json, ownFamily }, Buffer.from(body))?.detail;

describe('notAnAnswer', () => {
  it('passes answers of each API', () => {
    expect(judge('chat', '{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}')).toBeUndefined();
    expect(judge('completions', '{"choices":[{"text":"hi"}]}')).toBeUndefined();
    expect(judge('embeddings', '{"object":"list","data":[{"embedding":[0.1]}]}')).toBeUndefined();
    // A queued (background) response has no output yet, and is still an answer.
    expect(judge('responses', '{"object":"response","status":"queued","output":[]}')).toBeUndefined();
  });

  it('refuses an error delivered with a 200, an empty object and an answer without choices', () => {
    expect(judge('chat', '{"error":{"message":"Provider returned error","code":502}}')).toMatch(/2xx with an error/);
    expect(judge('chat', '{}')).toMatch(/has no choices/);
    expect(judge('chat', '{"object":"chat.completion","choices" :\n [ ] }')).toMatch(/choices are empty/);
    expect(judge('embeddings', '{"object":"list"}')).toMatch(/has no data/);
    expect(judge('responses', '{"id":"r"}')).toMatch(/has no output/);
  });

  it('refuses what is not a whole JSON object', () => {
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'text/html', ownFamily: true }, Buffer.from('<html></html>'))).toEqual({ detail: 'the upstream answered text/html, not JSON', ran: false });
    // The label names what a body that is no object is; a whole answer labelled text/plain is still the answer.
    const labelledPlain = '{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}';
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'text/plain; charset=utf-8', ownFamily: true }, Buffer.from(labelledPlain))).toBeUndefined();
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: 'text/plain', ownFamily: true }, Buffer.from(''))).toEqual({ detail: 'the upstream answered text/plain, not JSON', ran: false });
    expect(judge('chat', '  ')).toMatch(/empty body/);
    expect(judge('chat', '[1]')).toMatch(/not a whole JSON object/);
    expect(judge('chat', '{"choices":[]}]')).toMatch(/not a whole JSON object/);
  });

  it('refuses the start of an answer cut before its end, as an answer the provider ran', () => {
    const cut = { detail: 'the upstream answer was cut before its end: its JSON object never closes', ran: true };
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: json, ownFamily: true }, Buffer.from('{"choices":['))).toEqual(cut);
    // Cut just after a nested object: first and last bytes alone would pass it.
    expect(notAnAnswer({ api: 'chat', stream: false, contentType: json, ownFamily: true }, Buffer.from('{"choices":[{"message":{"content":"}"}}'))).toEqual(cut);
  });

  it('refuses a whole answer where a stream was asked for', () => {
    const answer = Buffer.from('{"choices":[{"message":{"content":"hi"}}]}');
    expect(notAnAnswer({ api: 'chat', stream: true, contentType: json, ownFamily: true }, answer)?.detail).toMatch(/a stream was asked for and the upstream answered application\/json/);
    expect(notAnAnswer({ api: 'embeddings', stream: true, contentType: json, ownFamily: true }, Buffer.from('{"data":[]}'))).toBeUndefined();
  });

  it('leaves paths it does not know, and other families\' fields, alone', () => {
    expect(judge('other', '{}')).toBeUndefined();
    expect(judge('chat', '{"type":"message","content":[]}', false)).toBeUndefined();
  });
});

describe('an Anthropic target\'s 2xx', () => {
  const config = parseConfig(
    `providers:
  claude: { family: anthropic, baseUrl: "http://127.0.0.1:9/v1", apiKey: k }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: claude, model: claude-x } ]
`,
    'test.yaml',
  );
  const prepared = prepareUpstream(config.providers['claude']!, {
    api: 'chat',
    clientPath: '/v1/chat/completions',
    query: '',
    json: { model: 'm', messages: [{ role: 'user', content: 'hi' }] },
    rawBody: Buffer.from(''),
    model: 'claude-x',
  });
  if (!prepared.ok) throw new Error(prepared.reason);
  const translator = prepared.request.translator!;

  it('is translated when it is a message', () => {
    const msg = { id: 'msg_1', type: 'message', role: 'assistant', model: 'claude-x', content: [{ type: 'text', text: 'hi' }], stop_reason: 'end_turn', usage: { input_tokens: 1, output_tokens: 1 } };
    const out = JSON.parse(translator.body(Buffer.from(JSON.stringify(msg))).toString()) as { choices: Array<{ message: { content: string } }> };
    expect(out.choices[0]!.message.content).toBe('hi');
  });

  it('is refused when it is anything else, rather than becoming an empty completion', () => {
    expect(() => translator.body(Buffer.from('{}'))).toThrow(/not an Anthropic message/);
    expect(() => translator.body(Buffer.from('{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'))).toThrow(/not an Anthropic message/);
  });
});
