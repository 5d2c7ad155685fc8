// Facts the README states about files in the repository: like the config reference and the error table, they must
// not drift from what they describe (a bench run committed without its README paragraph, a folder added to src/).
import { readdirSync, readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { FORWARD_REQUEST, FORWARD_RESPONSE } from '../src/providers/headers.ts';

const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');

interface Figure {
  name: string;
  value: number;
  direct: number;
  gateway: number;
}
interface OverheadResults {
  date: string;
  figures: Figure[];
  references: Array<{ name: string; ratio: number; cpuUsPerRequest: number; ttftAddedMs: number | null }>;
}
interface StormRun {
  amplification: number;
  successRate: number;
}
interface StormResults {
  date: string;
  commit: string;
  scenarios: Array<{ scenario: { name: string }; figures: Record<'direct-sdk' | 'direct-naive' | 'gateway', StormRun> }>;
}

/** A success rate as the README writes it: one decimal, two where one would round a failure away to 100%. */
function percent(rate: number): string {
  const one = (rate * 100).toFixed(1);
  if (rate === 1) return '100%';
  return `${one === '100.0' ? (rate * 100).toFixed(2) : one}%`;
}

describe('the README', () => {
  it('names every folder and top-level module under src/ in its layout', () => {
    const layout = readme.slice(readme.indexOf('## Layout'));
    const entries = readdirSync(new URL('../src/', import.meta.url), { withFileTypes: true }).map((e) => (e.isDirectory() ? `src/${e.name}/` : `src/${e.name}`));
    const missing = entries.filter((entry) => !new RegExp(`^${entry.replaceAll('.', '\\.')}\\s`, 'm').test(layout));
    expect(missing, 'add these to the Layout section of README.md').toEqual([]);
  });

  it('lists every header the gateway forwards, each way (the allowlists in providers/headers.ts)', () => {
    const section = readme.slice(readme.indexOf('### Headers'), readme.indexOf('### Paths'));
    const sent = section.slice(0, section.indexOf('- Passed back'));
    const passed = section.slice(section.indexOf('- Passed back'));
    expect([...FORWARD_REQUEST].filter((h) => !sent.includes(`\`${h}\``))).toEqual([]);
    expect([...FORWARD_RESPONSE].filter((h) => !passed.includes(`\`${h}\``))).toEqual([]);
  });

  it('describes the quick start\'s sample demo table with the table\'s own figures', () => {
    // The table is replaced by a newer run now and then; the sentence under it must follow.
    const direct = Number(/^successes\s+\d+ \(([\d.]+)%\)/m.exec(readme)?.[1]);
    const lost = Number(/SDK's retries add .*? and still lose (\d+)% of the calls/s.exec(readme)?.[1]);
    expect(Number.isFinite(direct) && Number.isFinite(lost), 'the demo table or the sentence under it is gone').toBe(true);
    expect(lost).toBe(Math.round(100 - direct));
  });

  it('quotes the latest overhead bench run, bench/results/overhead.json', () => {
    const results = JSON.parse(readFileSync(new URL('../bench/results/overhead.json', import.meta.url), 'utf8')) as OverheadResults;
    const figure = (prefix: string) => results.figures.find((f) => f.name.startsWith(prefix))!;
    const proxy = results.references.find((r) => r.name.startsWith('minimal fastify'))!;
    const nginx = results.references.find((r) => r.name.startsWith('nginx'))!;
    const paragraph = readme.slice(readme.indexOf('The latest run ('), readme.indexOf('Why 0.60x is out of reach here'));
    const ms = (x: number) => `+${x.toFixed(2)} ms`;
    const quoted = [
      `The latest run (${results.date.slice(0, 10)}, \`bench/results/overhead.md\``,
      `direct ${(figure('Throughput').direct / 1000).toFixed(1)}k`,
      `throughput ${figure('Throughput').value.toFixed(2)}x direct`,
      `p99 added at 500 req/s ${ms(figure('Latency p99').value)}`,
      `time to first token added ${ms(figure('Stream time to first token, median').value)}`,
      `proxy reached ${proxy.ratio.toFixed(2)}x and added ${ms(proxy.ttftAddedMs!)}`,
      `nginx ${nginx.ratio.toFixed(2)}x`,
      `gateway ${Math.round(figure('Server CPU').gateway)} µs`,
      `proxy ${Math.round(proxy.cpuUsPerRequest)} µs`,
      `nginx ${Math.round(nginx.cpuUsPerRequest)} µs`,
      `mock ${Math.round(figure('Server CPU').direct)} µs`,
    ];
    // The paragraph is wrapped at 120 columns: compare with line breaks and indentation as single spaces.
    const text = paragraph.replace(/\s+/g, ' ');
    expect(quoted.filter((q) => !text.includes(q)), 'update the `npm run bench` paragraph of README.md from bench/results/overhead.md').toEqual([]);
  });

  it('quotes the latest storm bench run, bench/results/storm.json', () => {
    const results = JSON.parse(readFileSync(new URL('../bench/results/storm.json', import.meta.url), 'utf8')) as StormResults;
    const brownout = results.scenarios.find((s) => s.scenario.name === 'brownout-503')!.figures;
    const paragraph = readme.slice(readme.indexOf('- `npm run bench:storm`'), readme.indexOf('- `npm run bench:priority`')).replace(/\s+/g, ' ');
    const x = (run: StormRun) => `${run.amplification.toFixed(2)}x`;
    const quoted = [
      `Latest run (${results.date.slice(0, 10)}, commit ${results.commit})`,
      `brownout amplification ${x(brownout.gateway)} through the gateway against ${x(brownout['direct-sdk'])} with SDK retries and ${x(brownout['direct-naive'])} with naive ones`,
      `success ${percent(brownout.gateway.successRate)} against ${percent(brownout['direct-sdk'].successRate)} and ${percent(brownout['direct-naive'].successRate)}`,
      `${percent(brownout.gateway.successRate)} of requests succeed`,
    ];
    expect(quoted.filter((q) => !paragraph.includes(q)), 'update the `npm run bench:storm` paragraph of README.md from bench/results/storm.md').toEqual([]);
  });
});
