// The JSON Schema subset a `response_format` may carry: what llama.cpp's grammar conversion (node-llama-cpp's
// GbnfJsonSchema) honours exactly. node-llama-cpp turns what it does not know into "any", which would be a format
// silently ignored, so the API refuses such a schema at once (invalid_request) and the engine checks it again.

/** Keywords of the JSON Schema subset llama.cpp's grammar conversion honours (node-llama-cpp's GbnfJsonSchema). */
const SCHEMA_KEYS: ReadonlySet<string> = new Set([
  'type',
  'properties',
  'required',
  'additionalProperties',
  'items',
  'prefixItems',
  'minItems',
  'maxItems',
  'enum',
  'const',
  'oneOf',
  '$defs',
  '$ref',
  'format',
  'minLength',
  'maxLength',
  'description',
  'minProperties',
  'maxProperties',
]);
const SCHEMA_TYPES: ReadonlySet<string> = new Set([
  'string',
  'number',
  'integer',
  'boolean',
  'null',
  'object',
  'array',
]);
/** Bounds of a schema a request may carry. */
export const SCHEMA_BOUNDS = Object.freeze({ depth: 16, nodes: 2000 });

/** Why `schema` is not a JSON schema the grammar honours exactly (null: it is). */
export function jsonSchemaProblem(schema: unknown): string | null {
  let nodes = 0;
  const walk = (x: unknown, path: string, depth: number): string | null => {
    if (++nodes > SCHEMA_BOUNDS.nodes) return `has more than ${SCHEMA_BOUNDS.nodes} parts`;
    if (depth > SCHEMA_BOUNDS.depth) return `nests deeper than ${SCHEMA_BOUNDS.depth} at ${path}`;
    if (x === true || x === false) return null;
    if (x === null || typeof x !== 'object' || Array.isArray(x)) return `${path} is not a schema object`;
    const o = x as Record<string, unknown>;
    for (const k of Object.keys(o)) if (!SCHEMA_KEYS.has(k)) return `${path} uses "${k}", which is not supported`;
    const types = Array.isArray(o['type']) ? o['type'] : o['type'] === undefined ? [] : [o['type']];
    for (const t of types) if (typeof t !== 'string' || !SCHEMA_TYPES.has(t)) return `${path}.type is not a JSON type`;
    if (typeof o['$ref'] === 'string' && !o['$ref'].startsWith('#/$defs/'))
      return `${path}.$ref must point into #/$defs/`;
    for (const k of ['properties', '$defs'] as const) {
      const m = o[k];
      if (m === undefined) continue;
      if (m === null || typeof m !== 'object' || Array.isArray(m)) return `${path}.${k} is not an object`;
      for (const [name, sub] of Object.entries(m)) {
        const bad = walk(sub, `${path}.${k}.${name}`, depth + 1);
        if (bad) return bad;
      }
    }
    for (const k of ['items', 'additionalProperties'] as const)
      if (o[k] !== undefined) {
        const bad = walk(o[k], `${path}.${k}`, depth + 1);
        if (bad) return bad;
      }
    if (o['format'] !== undefined && !['date-time', 'time', 'date'].includes(o['format'] as string))
      return `${path}.format must be "date-time", "time" or "date"`;
    for (const k of ['oneOf', 'prefixItems'] as const) {
      const list = o[k];
      if (list === undefined) continue;
      if (!Array.isArray(list)) return `${path}.${k} is not an array`;
      for (const [i, sub] of list.entries()) {
        const bad = walk(sub, `${path}.${k}[${i}]`, depth + 1);
        if (bad) return bad;
      }
    }
    if (o['enum'] !== undefined && !Array.isArray(o['enum'])) return `${path}.enum is not an array`;
    if (
      o['required'] !== undefined &&
      !(Array.isArray(o['required']) && o['required'].every((r) => typeof r === 'string'))
    )
      return `${path}.required is not a list of names`;
    return null;
  };
  return walk(schema, 'schema', 0);
}

/** Longest schema text a request may carry. */
export const MAX_SCHEMA_CHARS = 65_536;

/** The same for a schema given as JSON text (what a request carries). */
export function jsonSchemaTextProblem(text: string): string | null {
  if (text.length > MAX_SCHEMA_CHARS) return `schema is longer than ${MAX_SCHEMA_CHARS} characters`;
  let schema: unknown;
  try {
    schema = JSON.parse(text);
  } catch {
    return 'schema is not JSON';
  }
  return jsonSchemaProblem(schema);
}
