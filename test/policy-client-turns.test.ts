// Whose turn it is between a class's clients (policy/client-turns.ts), the rule the pools and the parking lot share.
import { describe, expect, it } from 'vitest';
import { newcomer, turnOrder } from '../src/policy/client-turns.ts';

describe('client turns', () => {
  it('puts the client holding fewer first, then the one served longer ago, and no one first between equals', () => {
    expect(turnOrder({ held: 1, servedAt: 9 }, { held: 2, servedAt: 1 })).toBeLessThan(0);
    expect(turnOrder({ held: 2, servedAt: 1 }, { held: 1, servedAt: 9 })).toBeGreaterThan(0);
    expect(turnOrder({ held: 1, servedAt: 3 }, { held: 1, servedAt: 4 })).toBeLessThan(0);
    expect(turnOrder({ held: 1, servedAt: 4 }, { held: 1, servedAt: 4 })).toBe(0);
  });

  it('ranks a newcomer after every client served before the latest service, and before the one just served', () => {
    const fresh = newcomer(10);
    expect(fresh.held).toBe(0);
    expect(turnOrder({ held: 0, servedAt: 9 }, fresh)).toBeLessThan(0);
    expect(turnOrder(fresh, { held: 0, servedAt: 10 })).toBeLessThan(0);
    expect(turnOrder(newcomer(10), fresh)).toBe(0);
  });
});
