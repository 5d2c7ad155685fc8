// A valid config as YAML text, which config tests splice mistakes into, and the ConfigError a text fails with.
// Line numbers in assertions refer to this text.
import { expect } from 'vitest';
import { ConfigError, parseConfig } from '../../src/config/load.ts';

export const validConfigText = (extra = '') => `providers:
  openai:
    family: openai
    baseUrl: https://api.openai.com/v1
    apiKey: \${OPENAI_API_KEY}
routes:
  - name: chat
    match: { path: /v1/chat/completions }
    targets: [ { provider: openai } ]
${extra}`;

/** The ConfigError that parsing `text` as gw.yaml throws; fails the test if it loads. */
export function configErrorOf(text: string, env: NodeJS.ProcessEnv): ConfigError {
  try {
    parseConfig(text, 'gw.yaml', env);
  } catch (err) {
    expect(err).toBeInstanceOf(ConfigError);
    return err as ConfigError;
  }
  throw new Error('expected the config to be rejected');
}
