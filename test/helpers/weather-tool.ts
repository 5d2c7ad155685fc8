// A runnable tool for the openai SDK's runTools(), shared by the suites that drive tool loops: it records each call's
// arguments so a test can tell how often the tool ran (a loop retried by the SDK would run it twice).
export function weatherTool(calls: unknown[]) {
  return {
    type: 'function' as const,
    function: {
      name: 'get_weather',
      description: 'Weather of a city',
      parameters: { type: 'object', properties: { x: { type: 'number' } } },
      function: (args: { x: number }) => {
        calls.push(args);
        return `sunny, ${args.x} degree`;
      },
      parse: (text: string) => JSON.parse(text) as { x: number },
    },
  };
}
