// Finds the schema that governs a path in the data, so errors can name the keys that are valid there.
// Reads zod 4's `_zod.def`, which is stable across zod 4 minor versions.
import type { core } from 'zod';

type Schema = core.$ZodType;

/** Strips wrappers that do not change the shape of the data (default, optional, pipe...). */
function unwrap(schema: Schema): Schema {
  let s = schema as core.$ZodTypes;
  for (;;) {
    const def = s._zod.def;
    switch (def.type) {
      case 'default':
      case 'prefault':
      case 'optional':
      case 'nullable':
      case 'nonoptional':
      case 'readonly':
      case 'catch':
        s = def.innerType as core.$ZodTypes;
        break;
      case 'pipe':
        s = def.in as core.$ZodTypes;
        break;
      case 'lazy':
        s = def.getter() as core.$ZodTypes;
        break;
      default:
        return s;
    }
  }
}

/** Schema of `schema[segment]`, or undefined when there is none. Unions answer with their first fitting option. */
function childSchema(schema: Schema, segment: PropertyKey): Schema | undefined {
  const s = unwrap(schema) as core.$ZodTypes;
  const def = s._zod.def;
  switch (def.type) {
    case 'object':
      return Object.hasOwn(def.shape, segment) ? def.shape[segment as string] : undefined;
    case 'array':
      return typeof segment === 'number' ? def.element : undefined;
    case 'record':
      return def.valueType;
    case 'union':
      for (const option of def.options) {
        const child = childSchema(option, segment);
        if (child) return child;
      }
      return undefined;
    default:
      return undefined;
  }
}

function schemaAt(root: Schema, path: readonly PropertyKey[]): Schema | undefined {
  let s: Schema | undefined = root;
  for (const seg of path) {
    if (!s) return undefined;
    s = childSchema(s, seg);
  }
  return s;
}

/** The keys an object schema accepts at `path` (all options' keys for a union); empty when it is no object. */
export function keysAt(root: Schema, path: readonly PropertyKey[]): string[] {
  const s = schemaAt(root, path);
  if (!s) return [];
  const def = (unwrap(s) as core.$ZodTypes)._zod.def;
  if (def.type === 'object') return Object.keys(def.shape);
  if (def.type === 'union') return [...new Set(def.options.flatMap((o) => keysAt(o, [])))];
  return [];
}

/** `['routes', 0, 'retry']` -> `routes[].retry`, `['providers', 'openai']` -> `providers.<name>`: the path as documented. */
export function genericPath(root: Schema, path: readonly PropertyKey[]): string {
  let out = '';
  let s: Schema | undefined = root;
  for (const seg of path) {
    const type = s ? (unwrap(s) as core.$ZodTypes)._zod.def.type : undefined;
    if (type === 'array') out += '[]';
    else if (type === 'record') out += '.<name>';
    else out += out ? `.${String(seg)}` : String(seg);
    s = s && childSchema(s, seg);
  }
  return out;
}

/** What a map's values are at `path` (`object` for providers, `string` for auth.keys), as the config reference says. */
export function mapValueKind(root: Schema, path: readonly PropertyKey[]): 'string' | 'object' {
  const s = schemaAt(root, path);
  const def = s ? (unwrap(s) as core.$ZodTypes)._zod.def : undefined;
  const value = def?.type === 'record' ? (unwrap(def.valueType) as core.$ZodTypes)._zod.def.type : undefined;
  return value === 'string' ? 'string' : 'object';
}

/**
 * Where `key` is valid below `path`, at the nearest level down that has it (at most `maxDepth` levels): `retry.maxAttempts`
 * for a route's `maxAttempts`, `targets[].provider` for its `provider`. Maps of names (`providers.<name>`) are not entered.
 */
export function placesBelow(root: Schema, path: readonly PropertyKey[], key: string, maxDepth = 2): string[] {
  let level: Array<{ at: PropertyKey[]; shown: string }> = [{ at: [...path], shown: '' }];
  for (let depth = 0; depth < maxDepth && level.length > 0; depth++) {
    level = level.flatMap(({ at, shown }) =>
      keysAt(root, at).map((child) => {
        const s = schemaAt(root, [...at, child]);
        const list = s !== undefined && (unwrap(s) as core.$ZodTypes)._zod.def.type === 'array';
        return { at: list ? [...at, child, 0] : [...at, child], shown: `${shown ? `${shown}.` : ''}${child}${list ? '[]' : ''}` };
      }),
    );
    const found = level.filter(({ at }) => keysAt(root, at).includes(key)).map(({ shown }) => `${shown}.${key}`);
    if (found.length > 0) return found;
  }
  return [];
}
