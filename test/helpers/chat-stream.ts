// A chat stream read through the openai SDK as a user's loop would, for the tests that check what the client got of
// an answer that may break: the text its deltas carried, and the error the SDK raised for the break, if one did.
import type { ChatCompletionChunk } from 'openai/resources/chat/completions';

export async function streamedText(stream: AsyncIterable<ChatCompletionChunk>): Promise<{ text: string; err: Error | undefined }> {
  let text = '';
  try {
    for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  } catch (e) {
    return { text, err: e as Error };
  }
  return { text, err: undefined };
}
