// Reading an openai SDK `responses.stream()` to its end, for suites that check what a broken Responses stream gives.
import type OpenAI from 'openai';

type ResponseEvent = OpenAI.Responses.ResponseStreamEvent;

/** Reads a `responses.stream()` to its end: the events it yielded, and its finalResponse() or the error either raised. */
export async function readResponseStream(stream: ReturnType<OpenAI['responses']['stream']>) {
  const events: ResponseEvent[] = [];
  let error: unknown;
  let final: OpenAI.Responses.Response | undefined;
  try {
    for await (const ev of stream) events.push(ev);
    final = await stream.finalResponse();
  } catch (e) {
    error = e;
  }
  return { events, final, error };
}
