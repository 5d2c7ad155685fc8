// The SSE framing: events split anywhere across reads, every line-ending style, and a bound on what a provider can
// make the gateway hold (an event that never ends).
import { describe, expect, it } from 'vitest';
import { MAX_EVENT_BYTES, SseEventTooLarge, SseParser } from '../src/streaming/sse-parser.ts';

const bytes = (s: string) => Buffer.from(s);

describe('the SSE parser', () => {
  it('frames events split anywhere across reads, with LF, CRLF or CR line endings', () => {
    for (const nl of ['\n', '\r\n', '\r']) {
      const text = `data: {"a":1}${nl}${nl}: ping${nl}${nl}event: x${nl}data: two${nl}data: lines${nl}${nl}`;
      for (let cut = 1; cut < text.length; cut++) {
        const p = new SseParser();
        const events = [...p.push(bytes(text.slice(0, cut))), ...p.push(bytes(text.slice(cut)))];
        expect(events.map((e) => [e.event, e.data])).toEqual([
          [null, '{"a":1}'],
          [null, null],
          ['x', 'two\nlines'],
        ]);
      }
    }
  });

  it('finds an event end split over several short reads, down to one byte per read', () => {
    for (const nl of ['\n', '\r\n', '\r']) {
      const text = `data: a${nl}${nl}data: b${nl}${nl}`;
      const p = new SseParser();
      const events = [...text].flatMap((ch) => p.push(bytes(ch)));
      expect(events.map((e) => e.data)).toEqual(['a', 'b']);
    }
  });

  it('ends an event at mixed line endings (LF then CRLF, CRLF then LF)', () => {
    const p = new SseParser();
    expect(p.push(bytes('data: {"a":1}\n\r\ndata: {"b":2}\r\n\n')).map((e) => e.data)).toEqual(['{"a":1}', '{"b":2}']);
  });

  it('reads a long event in many small reads in linear time', () => {
    const p = new SseParser();
    const started = Date.now();
    p.push(bytes('data: '));
    const piece = bytes('a'.repeat(1024));
    for (let i = 0; i < 8 * 1024; i++) expect(p.push(piece)).toEqual([]);
    const [event] = p.push(bytes('\n\n'));
    expect(event!.data!.length).toBe(8 * 1024 * 1024);
    // Quadratic rescanning would take minutes here; a loaded 2-core machine does this in well under a second.
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('gives up on an event larger than the limit', () => {
    const p = new SseParser();
    const piece = bytes(`data: ${'a'.repeat(1024 * 1024)}`);
    expect(() => {
      for (let i = 0; i <= MAX_EVENT_BYTES / piece.length + 1; i++) p.push(piece);
    }).toThrow(SseEventTooLarge);
  });

  it('returns the events a read completes before an oversized one, and gives up at the next read or the end', () => {
    const read = bytes(`data: {"a":1}\n\n: ping\n\ndata: ${'a'.repeat(MAX_EVENT_BYTES)}`);
    const next = new SseParser();
    expect(next.push(read).map((e) => e.data)).toEqual(['{"a":1}', null]);
    // Even bytes that would end it: the event is over the limit already.
    expect(() => next.push(bytes('\n\n'))).toThrow(SseEventTooLarge);
    const end = new SseParser();
    expect(end.push(read)).toHaveLength(2);
    expect(() => end.flush()).toThrow(SseEventTooLarge);
  });
});
