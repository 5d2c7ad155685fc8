// A JSON Schema for OpenAI's structured outputs (response_format json_schema, strict tools) -> one Anthropic's
// constrained decoding takes. Anthropic takes a subset and answers 400 to the rest ("output_config.format.schema: For
// 'integer' type, property 'minimum' is not supported"), where OpenAI's strict mode takes minimum/maximum, pattern,
// minLength, maxItems and more: the schemas the openai SDK's zodResponseFormat writes for `.int().min(1)`, `.max(280)`
// or `.email()`. The rule is Anthropic's own SDKs' (lib/transform-json-schema in @anthropic-ai/sdk): keep what it
// takes, and write each other constraint into the node's description, where the model still reads it; every object
// gets additionalProperties false, which Anthropic requires (and OpenAI's strict mode already asks for).
import { Inexpressible } from './messages.ts';

type Schema = Record<string, unknown>;

/** String formats Anthropic's structured outputs take; another one goes to the description. */
const STRING_FORMATS: ReadonlySet<string> = new Set(['date-time', 'time', 'date', 'duration', 'email', 'hostname', 'uri', 'ipv4', 'ipv6', 'uuid']);

const isPrimitive = (v: unknown) => v === null || typeof v !== 'object';
const isSchema = (v: unknown): v is Schema => typeof v === 'object' && v !== null && !Array.isArray(v);

/** Translates one schema (the root or any node in it); `at` names it for an Inexpressible's param. Pure. */
export function toAnthropicSchema(schema: Schema, at: string): Schema {
  const rest: Schema = { ...schema };
  const take = (key: string): unknown => {
    const v = rest[key];
    delete rest[key];
    return v;
  };
  const out: Schema = {};
  // `definitions` is draft-07's name for $defs, the one the openai SDK's zodResponseFormat writes for a reused schema.
  for (const key of ['$defs', 'definitions']) {
    const defs = take(key);
    if (isSchema(defs)) out[key] = Object.fromEntries(Object.entries(defs).map(([k, d]) => [k, node(d, `${at}.${key}.${k}`)]));
  }
  const ref = take('$ref');
  if (ref !== undefined) return { ...out, $ref: ref };
  const values = rest['enum'];
  if (Array.isArray(values) && values.length > 0 && values.every(isPrimitive)) out['enum'] = take('enum');
  if (rest['const'] !== undefined && isPrimitive(rest['const'])) out['const'] = take('const');
  const literal = 'enum' in out || 'const' in out;
  const type = take('type');
  take('$schema'); // names the dialect, constrains nothing
  // oneOf as anyOf, as Anthropic's SDKs send it: the structured-output subset has no oneOf. One combinator per node:
  // a second one (allOf beside anyOf, oneOf beside anyOf) stays in `rest`, so it goes to the description, not nowhere.
  const either = Array.isArray(rest['anyOf']) ? take('anyOf') : Array.isArray(rest['oneOf']) ? take('oneOf') : undefined;
  const allOf = either === undefined && Array.isArray(rest['allOf']) ? take('allOf') : undefined;
  if (Array.isArray(either)) out['anyOf'] = either.map((s, i) => node(s, `${at}.anyOf[${i}]`));
  else if (Array.isArray(allOf)) out['allOf'] = allOf.map((s, i) => node(s, `${at}.allOf[${i}]`));
  else if (!literal && type !== undefined) out['type'] = type;
  for (const key of ['description', 'title']) if (rest[key] !== undefined) out[key] = take(key);
  // A nullable node may name its types as a list (`["object", "null"]`): its properties or items are still schemas.
  const types = new Set(Array.isArray(type) ? type : [type]);
  if (types.has('object')) {
    const extra = take('additionalProperties');
    // Anthropic constrains every object to its listed properties: one that allows others cannot be expressed.
    if (extra !== undefined && extra !== false) throw new Inexpressible(`${at}: an object that allows additionalProperties is not supported by an Anthropic target`, at);
    const props = take('properties');
    out['properties'] = isSchema(props) ? Object.fromEntries(Object.entries(props).map(([k, p]) => [k, node(p, `${at}.properties.${k}`)])) : {};
    out['additionalProperties'] = false;
    if (rest['required'] !== undefined) out['required'] = take('required');
  }
  if (types.has('string') && typeof rest['format'] === 'string' && STRING_FORMATS.has(rest['format'])) out['format'] = take('format');
  if (types.has('array')) {
    const items = take('items');
    if (items !== undefined) out['items'] = node(items, `${at}.items`);
    if (rest['minItems'] === 0 || rest['minItems'] === 1) out['minItems'] = take('minItems');
  }
  const left = Object.entries(rest);
  if (left.length > 0) {
    const said = `{${left.map(([k, v]) => `${k}: ${JSON.stringify(v)}`).join(', ')}}`;
    out['description'] = typeof out['description'] === 'string' ? `${out['description']}\n\n${said}` : said;
  }
  return out;
}

function node(schema: unknown, at: string): unknown {
  // `true`/`false` schemas and other non-objects have nothing to translate.
  return isSchema(schema) ? toAnthropicSchema(schema, at) : schema;
}
