// How each family addresses a request: the path, the credentials header and the model, per API.
import { describe, expect, it } from 'vitest';
import { parseConfig } from '../src/config/load.ts';
import { prepareUpstream } from '../src/providers/families.ts';
import type { ApiKind } from '../src/routing/router.ts';

const config = parseConfig(
  `providers:
  az: { family: azure-openai, baseUrl: "https://res.openai.azure.com", apiKey: az-key, apiVersion: "2024-10-21" }
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: az } ]
`,
  'test.yaml',
);

function prepare(api: ApiKind, clientPath: string, json: Record<string, unknown>, model: string) {
  const prepared = prepareUpstream(config.providers['az']!, { api, clientPath, query: '', json, rawBody: Buffer.from(JSON.stringify(json)), model });
  if (!prepared.ok) throw new Error(prepared.reason);
  return prepared.request;
}

describe('azure-openai', () => {
  it('sends chat completions and embeddings to the deployment, with api-version and the api-key header', () => {
    const chat = prepare('chat', '/v1/chat/completions', { model: 'gpt-4o', messages: [] }, 'gpt-4o');
    expect(chat.path).toBe('/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21');
    expect(chat.headers).toEqual({ 'api-key': 'az-key' });
    expect(prepare('embeddings', '/v1/embeddings', { model: 'emb', input: 'x' }, 'emb').path).toBe('/openai/deployments/emb/embeddings?api-version=2024-10-21');
  });

  it('sends the Responses API to the v1 surface, the deployment named in the body', () => {
    const req = prepare('responses', '/v1/responses', { model: 'gpt-4o', input: 'hi' }, 'my-deployment');
    expect(req.path).toBe('/openai/v1/responses');
    expect(req.headers).toEqual({ 'api-key': 'az-key' });
    expect(JSON.parse(req.body.toString()).model).toBe('my-deployment');
  });
});
