// The floor of the gateway's own stack: fastify + undici + one pino line per request, and no policy at all (no
// deadline, pool, budget, breaker, metrics or retries). The overhead bench measures it next to the gateway, so the
// report tells what the stack costs on this machine from what stormgate's pipeline adds. Streams (`stream: true`)
// are piped through as they come, so their time to first token is the stack's too.
// Plain JavaScript, run by node without a loader: nothing but the libraries is measured.
//   node bench/reference/fastify-proxy.mjs <port> <upstream origin> <log file>
import Fastify from 'fastify';
import pino from 'pino';
import { Pool } from 'undici';

const [port, upstream, logFile] = process.argv.slice(2);
const pool = new Pool(upstream, { connections: 128 });
const app = Fastify({ loggerInstance: pino({ level: 'info' }, pino.destination(logFile)), disableRequestLogging: true });

app.removeAllContentTypeParsers();
app.addContentTypeParser('application/json', { parseAs: 'buffer' }, (_req, body, done) => {
  try {
    // Parsed as the gateway does (it reads the model and `stream`), and forwarded as the raw bytes.
    done(null, { raw: body, json: JSON.parse(body.toString('utf8')) });
  } catch (err) {
    done(err, undefined);
  }
});
app.post('/v1/chat/completions', async (request, reply) => {
  const res = await pool.request({
    path: request.url,
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer sk-reference' },
    body: request.body.raw,
  });
  reply.code(res.statusCode).header('content-type', res.headers['content-type']);
  if (request.body.json.stream === true) return reply.send(res.body);
  return reply.send(Buffer.from(await res.body.arrayBuffer()));
});
app.addHook('onResponse', async (request, reply) => {
  request.log.info({ method: request.method, path: request.url, status: reply.statusCode, durationMs: Math.round(reply.elapsedTime) }, 'request');
});

await app.listen({ port: Number(port), host: '127.0.0.1' });
process.on('SIGTERM', () => app.close().then(() => process.exit(0)));
