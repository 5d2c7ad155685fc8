// A hand-written Azure OpenAI server for wire QA: deployments paths with api-version, the v1 surface for the Responses
// API, the api-key header, and Azure's own answers (its error bodies, content filter results, annotation chunks with
// empty choices, retry-after-ms, x-ms-region, apim-request-id), as its REST reference and real captures show them.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';

export type AzureFault =
  | 'ok'
  | 'rate-limited'
  | 'overloaded'
  | 'bad-key'
  | 'firewall'
  | 'prompt-filtered'
  | 'output-filtered'
  /** Asynchronous filter mode: the stream's last part is found in violation after the model's finish. */
  | 'late-verdict'
  | 'server-error';

export interface AzureSeen {
  method: string;
  url: string;
  headers: IncomingMessage['headers'];
  body: Record<string, unknown>;
}

interface AzureOptions {
  apiKey: string;
  deployments: string[];
  apiVersion?: string;
  /** Faults for the next requests, one each, in order; then `ok`. */
  faults?: AzureFault[];
  /** Pause between stream chunks, ms. */
  chunkGapMs?: number;
  /** With `late-verdict`: how long after the finish the asynchronous filter's verdict comes, ms. */
  verdictDelayMs?: number;
  seen?: AzureSeen[];
}

/** Azure's content filter results for a prompt or an answer that passed every category. */
export const FILTER_SAFE = { hate: { filtered: false, severity: 'safe' }, self_harm: { filtered: false, severity: 'safe' }, sexual: { filtered: false, severity: 'safe' }, violence: { filtered: false, severity: 'safe' } };
const FILTER_HIT = { ...FILTER_SAFE, violence: { filtered: true, severity: 'medium' }, jailbreak: { filtered: true, detected: true } };

/** The prompt filter's 400 body, as Azure answers it, with the filter's results for the prompt. */
export const azureFilter400 = (contentFilterResult: object = FILTER_HIT) => ({
  error: {
    message: "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry. To learn more about our content filtering policies please read our documentation: https://go.microsoft.com/fwlink/?linkid=2198766",
    type: null,
    param: 'prompt',
    code: 'content_filter',
    status: 400,
    innererror: { code: 'ResponsibleAIPolicyViolation', content_filter_result: contentFilterResult },
  },
});

const azureHeaders = (extra: Record<string, string> = {}) => ({
  'apim-request-id': 'a0b1c2d3-0000-4000-8000-000000000001',
  'x-request-id': 'a0b1c2d3-0000-4000-8000-000000000001',
  'x-ms-region': 'Sweden Central',
  'x-ms-rai-invoked': 'true',
  'x-ratelimit-remaining-requests': '99',
  'x-ratelimit-remaining-tokens': '99000',
  'azureml-model-session': 'd999-20250101',
  ...extra,
});

function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { 'content-type': 'application/json', ...azureHeaders(headers) });
  res.end(JSON.stringify(body));
}

export function azureHandler(opts: AzureOptions): (req: IncomingMessage, res: ServerResponse) => void {
  const faults = [...(opts.faults ?? [])];
  return (req, res) => {
    let raw = '';
    req.on('data', (d: Buffer) => (raw += d.toString()));
    req.on('end', () => {
      const body = raw ? (JSON.parse(raw) as Record<string, unknown>) : {};
      opts.seen?.push({ method: req.method ?? '', url: req.url ?? '', headers: req.headers, body });
      void answer(opts, faults.shift() ?? 'ok', req, res, body);
    });
  };
}

async function answer(opts: AzureOptions, fault: AzureFault, req: IncomingMessage, res: ServerResponse, body: Record<string, unknown>): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://azure');
  if (req.headers['api-key'] !== opts.apiKey || fault === 'bad-key') {
    return json(res, 401, { error: { code: '401', message: 'Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource.' } });
  }
  if (fault === 'firewall') return json(res, 403, { error: { code: '403', message: 'Access denied due to Virtual Network/Firewall rules.' } });
  let deployment: string | undefined;
  let op: string;
  const dep = /^\/openai\/deployments\/([^/]+)\/(chat\/completions|embeddings|completions)$/.exec(url.pathname);
  if (dep) {
    if (url.searchParams.get('api-version') !== (opts.apiVersion ?? '2024-10-21')) {
      return json(res, 404, { error: { code: '404', message: 'Resource not found' } });
    }
    deployment = decodeURIComponent(dep[1]!);
    op = dep[2]!;
  } else if (url.pathname === '/openai/v1/responses' || url.pathname === '/openai/v1/chat/completions') {
    deployment = typeof body.model === 'string' ? body.model : undefined;
    op = url.pathname.slice('/openai/v1/'.length);
  } else {
    return json(res, 404, { error: { code: '404', message: 'Resource not found' } });
  }
  if (!deployment || !opts.deployments.includes(deployment)) {
    return json(res, 404, { error: { code: 'DeploymentNotFound', message: 'The API deployment for this resource does not exist. If you created the deployment within the last 5 minutes, please wait a moment and try again.' } });
  }
  switch (fault) {
    case 'rate-limited':
      return json(
        res,
        429,
        { error: { code: '429', message: `Requests to the ChatCompletions_Create Operation under Azure OpenAI API version ${opts.apiVersion ?? '2024-10-21'} have exceeded token rate limit of your current OpenAI S0 pricing tier. Please retry after 1 second. Please go here: https://aka.ms/oai/quotaincrease if you would like to further increase the default rate limit.` } },
        { 'retry-after': '1', 'retry-after-ms': '150', 'x-ratelimit-remaining-requests': '0', 'x-ratelimit-remaining-tokens': '0' },
      );
    case 'overloaded':
      return json(res, 503, { error: { code: '503', message: 'The engine is currently overloaded, please try again later' } });
    case 'server-error':
      return json(res, 500, { error: { code: 'InternalServerError', message: 'The service is temporarily unable to process your request. Please try again later.' } });
    case 'prompt-filtered':
      return json(res, 400, azureFilter400());
    default:
  }
  if (op === 'embeddings') {
    const inputs = Array.isArray(body.input) ? body.input : [body.input];
    // The SDK asks for base64 unless told otherwise, and decodes it.
    const vector = body.encoding_format === 'base64' ? Buffer.from(new Float32Array([0.1, 0.2, 0.3]).buffer).toString('base64') : [0.1, 0.2, 0.3];
    return json(res, 200, { object: 'list', data: inputs.map((_, i) => ({ object: 'embedding', index: i, embedding: vector })), model: 'text-embedding-3-small', usage: { prompt_tokens: 7, total_tokens: 7 } });
  }
  if (op === 'responses') return responses(res, body);
  const filtered = fault === 'output-filtered';
  const tools = Array.isArray(body.tools) && body.tools.length > 0;
  if (body.stream === true) return chatStream(res, opts, body, filtered, tools, fault === 'late-verdict');
  const message = tools
    ? { role: 'assistant', content: null, refusal: null, tool_calls: [{ id: 'call_az1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] }
    : { role: 'assistant', content: filtered ? null : 'Hello from Azure.', refusal: null };
  return json(res, 200, {
    choices: [{ content_filter_results: filtered ? FILTER_HIT : FILTER_SAFE, finish_reason: filtered ? 'content_filter' : tools ? 'tool_calls' : 'stop', index: 0, logprobs: null, message }],
    created: 1735000000,
    id: 'chatcmpl-AZ1',
    model: 'gpt-4o-2024-11-20',
    object: 'chat.completion',
    prompt_filter_results: [{ prompt_index: 0, content_filter_results: FILTER_SAFE }],
    system_fingerprint: 'fp_az',
    usage: { completion_tokens: 5, completion_tokens_details: { accepted_prediction_tokens: 0, audio_tokens: 0, reasoning_tokens: 0, rejected_prediction_tokens: 0 }, prompt_tokens: 11, prompt_tokens_details: { audio_tokens: 0, cached_tokens: 0 }, total_tokens: 16 },
  });
}

async function chatStream(res: ServerResponse, opts: AzureOptions, body: Record<string, unknown>, filtered: boolean, tools: boolean, lateVerdict: boolean): Promise<void> {
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', ...azureHeaders() });
  const gap = opts.chunkGapMs ?? 0;
  const send = async (o: unknown) => {
    if (res.destroyed) return;
    res.write(`data: ${JSON.stringify(o)}\n\n`);
    if (gap) await sleep(gap);
  };
  const base = { created: 1735000000, id: 'chatcmpl-AZ2', model: 'gpt-4o-2024-11-20', object: 'chat.completion.chunk', system_fingerprint: 'fp_az' };
  // The prompt's annotation: no choices at all.
  await send({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [{ prompt_index: 0, content_filter_results: FILTER_SAFE }] });
  await send({ ...base, choices: [{ content_filter_results: {}, delta: { content: '', refusal: null, role: 'assistant' }, finish_reason: null, index: 0, logprobs: null }] });
  if (tools) {
    await send({ ...base, choices: [{ content_filter_results: {}, delta: { tool_calls: [{ index: 0, id: 'call_az1', type: 'function', function: { name: 'get_weather', arguments: '' } }] }, finish_reason: null, index: 0, logprobs: null }] });
    await send({ ...base, choices: [{ content_filter_results: {}, delta: { tool_calls: [{ index: 0, function: { arguments: '{"city":' } }] }, finish_reason: null, index: 0, logprobs: null }] });
    await send({ ...base, choices: [{ content_filter_results: {}, delta: { tool_calls: [{ index: 0, function: { arguments: '"Oslo"}' } }] }, finish_reason: null, index: 0, logprobs: null }] });
    await send({ ...base, choices: [{ content_filter_results: {}, delta: {}, finish_reason: 'tool_calls', index: 0, logprobs: null }] });
  } else {
    for (const word of ['Hello', ' from', ' Azure.']) {
      await send({ ...base, choices: [{ content_filter_results: FILTER_SAFE, delta: { content: word }, finish_reason: null, index: 0, logprobs: null }] });
    }
    if (filtered) await send({ ...base, choices: [{ content_filter_results: FILTER_HIT, delta: {}, finish_reason: 'content_filter', index: 0, logprobs: null }] });
    else await send({ ...base, choices: [{ content_filter_results: {}, delta: {}, finish_reason: 'stop', index: 0, logprobs: null }] });
  }
  if (lateVerdict) {
    // The asynchronous filter's annotation of the last part, then its verdict, as Azure's content streaming guide shows
    // them: no delta, empty id and model, the offsets of the text checked.
    await sleep(opts.verdictDelayMs ?? 0);
    const offsets = { check_offset: 17, start_offset: 0, end_offset: 17 };
    await send({ choices: [{ content_filter_offsets: offsets, content_filter_results: FILTER_HIT, finish_reason: null, index: 0 }], created: 0, id: '', model: '', object: '' });
    await send({ choices: [{ content_filter_offsets: offsets, content_filter_results: FILTER_HIT, finish_reason: 'content_filter', index: 0 }], created: 0, id: '', model: '', object: '' });
  }
  const options = body.stream_options as { include_usage?: boolean } | undefined;
  if (options?.include_usage) await send({ ...base, choices: [], usage: { completion_tokens: 3, prompt_tokens: 11, total_tokens: 14 } });
  if (!res.destroyed) res.end('data: [DONE]\n\n');
}

function responses(res: ServerResponse, body: Record<string, unknown>): void {
  const response = (status: string, output: unknown[], usage: unknown) => ({
    id: 'resp_az1', object: 'response', created_at: 1735000000, status, error: null, incomplete_details: null, instructions: null, max_output_tokens: null,
    model: String(body.model), output, parallel_tool_calls: true, previous_response_id: null, reasoning: { effort: null, summary: null }, store: true, temperature: 1,
    text: { format: { type: 'text' } }, tool_choice: 'auto', tools: [], top_p: 1, truncation: 'disabled', usage, user: null, metadata: {},
    content_filters: null,
  });
  const item = { id: 'msg_az1', type: 'message', status: 'completed', role: 'assistant', content: [{ type: 'output_text', text: 'Hello from Azure.', annotations: [] }] };
  const usage = { input_tokens: 9, input_tokens_details: { cached_tokens: 0 }, output_tokens: 4, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 13 };
  if (body.stream !== true) return json(res, 200, response('completed', [item], usage));
  res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', ...azureHeaders() });
  let seq = 0;
  const ev = (type: string, fields: Record<string, unknown>) => res.write(`event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: seq++, ...fields })}\n\n`);
  ev('response.created', { response: response('in_progress', [], null) });
  ev('response.in_progress', { response: response('in_progress', [], null) });
  ev('response.output_item.added', { output_index: 0, item: { ...item, status: 'in_progress', content: [] } });
  ev('response.content_part.added', { item_id: 'msg_az1', output_index: 0, content_index: 0, part: { type: 'output_text', text: '', annotations: [] } });
  ev('response.output_text.delta', { item_id: 'msg_az1', output_index: 0, content_index: 0, delta: 'Hello from Azure.' });
  ev('response.output_text.done', { item_id: 'msg_az1', output_index: 0, content_index: 0, text: 'Hello from Azure.' });
  ev('response.content_part.done', { item_id: 'msg_az1', output_index: 0, content_index: 0, part: item.content[0] });
  ev('response.output_item.done', { output_index: 0, item });
  ev('response.completed', { response: response('completed', [item], usage) });
  res.end();
}
