import { describe, expect, it } from 'vitest';
import { MovingAverage } from '../src/policy/moving-average.ts';

describe('the moving average of round trips and slot holds', () => {
  it('holds its initial guess until the first sample, which it then takes whole', () => {
    const avg = new MovingAverage(1_000);
    expect(avg.value).toBe(1_000);
    avg.add(40);
    expect(avg.value).toBe(40);
  });

  it('gives each later sample a fifth of the weight', () => {
    const avg = new MovingAverage(1_000);
    avg.add(100);
    avg.add(200);
    expect(avg.value).toBeCloseTo(120, 10);
    avg.add(200);
    expect(avg.value).toBeCloseTo(136, 10);
  });
});
