// An unknown key is nearly always a typo or an old name, so the error says which key was meant.
import type { core } from 'zod';
import { genericPath, keysAt, placesBelow } from './schema-walk.ts';

/**
 * Keys that were renamed, by documented path (`routes[].retry.attempts`). A renamed key fails with a pointer
 * to its new name instead of being read silently, as undici does with its retired options.
 */
const RENAMED_KEYS: Readonly<Record<string, string>> = {
  'routes[].timeout': 'timeoutMs',
  'routes[].retry.attempts': 'maxAttempts',
  'providers.<name>.timeouts.connect': 'connectMs',
};

/** Message for `key`, which the schema does not accept in the object at `parentPath`. */
export function explainUnknownKey(root: core.$ZodType, parentPath: readonly PropertyKey[], key: string): string {
  const where = genericPath(root, parentPath);
  const renamed = RENAMED_KEYS[where ? `${where}.${key}` : key];
  if (renamed) return `unknown key "${key}"; it was renamed to "${renamed}"`;
  const valid = keysAt(root, parentPath);
  const guess = closest(key, valid);
  // A key of a level down, written a level too high (a route's `maxAttempts`, a provider's `connectMs`): where it goes,
  // not the nearest word of this level (`minAttemptMs`). A key of this level one letter off (`provider` at the top) is
  // that key misspelt.
  const below = guess !== undefined && levenshtein(key.toLowerCase(), guess.toLowerCase()) <= 1 ? [] : placesBelow(root, parentPath, key);
  if (below.length > 0) return `unknown key "${key}"; did you mean ${below.join(' or ')}?`;
  if (guess) return `unknown key "${key}"; did you mean "${guess}"?`;
  return valid.length ? `unknown key "${key}"; valid keys: ${valid.join(', ')}` : `unknown key "${key}"`;
}

/**
 * The candidate a user most likely meant: the same word in other case, a candidate that `word` is the start of
 * (`connect` -> `connectMs`: the unit was left out), or the nearest within a few edits.
 */
export function closest(word: string, candidates: readonly string[]): string | undefined {
  const lower = word.toLowerCase();
  const prefixed = candidates.filter((c) => c.toLowerCase().startsWith(lower) && lower.length >= 3);
  if (prefixed.length === 1) return prefixed[0];
  const limit = Math.min(3, Math.ceil(word.length / 3));
  let best: string | undefined;
  let bestDistance = limit + 1;
  for (const candidate of candidates) {
    const d = levenshtein(lower, candidate.toLowerCase());
    if (d < bestDistance) {
      best = candidate;
      bestDistance = d;
    }
  }
  return best;
}

function levenshtein(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    }
    prev = row;
  }
  return prev[b.length]!;
}
