// The configuration reference (docs/configuration.md), written from the scenario schema itself: every field with
// what it accepts (type and bounds), its default, and the matching vLLM and SGLang flag where one exists. A test
// fails when the file differs from what this writes, so the reference cannot drift from the code.
import type { Schema } from '../transport/schema.ts';
import { scenarioSchema } from './config.ts';

/** One field of the reference. */
export interface ReferenceRow {
  path: string;
  accepts: string;
  default: string;
  flags: string;
}

/** Fields with an equivalent in vLLM (`vllm serve`) or SGLang (`python -m sglang.launch_server`), by path. */
const FLAGS: Readonly<Record<string, string>> = {
  'models[].name': 'vLLM `--served-model-name`; SGLang `--served-model-name`',
  'models[].tp': 'vLLM `--tensor-parallel-size`; SGLang `--tp-size`',
  'models[].batching.policy':
    'vLLM `--enable-chunked-prefill` (`chunked`); SGLang `--chunked-prefill-size` (-1: `prefill-first`)',
  'models[].batching.maxRunning': 'vLLM `--max-num-seqs`; SGLang `--max-running-requests`',
  'models[].batching.tokenBudget': 'vLLM `--max-num-batched-tokens`; SGLang `--chunked-prefill-size`',
  'models[].batching.blockTokens': 'vLLM `--block-size`; SGLang `--page-size`',
  'models[].batching.maxContext': 'vLLM `--max-model-len`; SGLang `--context-length`',
  'models[].batching.kvBlocks': 'vLLM `--num-gpu-blocks-override`; SGLang `--max-total-tokens` (in tokens)',
  'models[].batching.prefixCache': 'vLLM `--enable-prefix-caching`; SGLang radix cache (`--disable-radix-cache` off)',
  'models[].aliases': 'vLLM `--served-model-name` (several names for one model)',
  'models[].sequences': 'llama.cpp server `--parallel`',
  'models[].contextTokens': 'llama.cpp server `--ctx-size` (per sequence here)',
  'models[].threads': 'llama.cpp server `--threads`',
  'models[].gpuLayers': 'llama.cpp server `--n-gpu-layers`',
  'models[].batchTokens': 'llama.cpp server `--batch-size`',
  'routing.policy': 'the Gateway API Inference Extension endpoint picker does this across pods',
  'routing.prefix': 'SGLang router `--policy cache_aware`; the inference extension prefix-cache scorer',
};

/** Longest description of what a field accepts (a list of every profile name stays readable). */
const MAX_ACCEPTS = 240;

const short = (text: string, max = MAX_ACCEPTS): string => (text.length <= max ? text : `${text.slice(0, max - 1)}…`);

/** A default as written; an object of fields shows none: its fields have rows (and defaults) of their own. */
const defaultText = (v: unknown, inner: Schema<unknown>): string =>
  inner.fields ? '(fields below)' : short(`\`${JSON.stringify(v)}\``, 120);

/** What a (possibly wrapped) schema accepts, in words. */
function acceptsOf(s: Schema<unknown>): string {
  if (s.kind === 'optional' || s.kind === 'default') return acceptsOf(s.doc!.inner!);
  if (s.kind === 'nullable') return `${acceptsOf(s.doc!.inner!)}, or null`;
  if (s.fields) return 'object';
  if (s.kind === 'arr') return `${s.doc?.expected ?? 'array'} of ${acceptsOf(s.doc!.inner!)}`;
  if (s.kind === 'record')
    return `${s.doc?.expected ?? 'object'} (names of your choosing) of ${acceptsOf(s.doc!.inner!)}`;
  return s.doc?.expected ?? s.kind;
}

/** The schema inside optional/default/nullable wrappers, its default and whether the field may be left out. */
function unwrap(s: Schema<unknown>): { inner: Schema<unknown>; dflt: unknown; optional: boolean } {
  let inner = s;
  let dflt: unknown;
  let optional = false;
  for (;;) {
    if (inner.kind === 'default') {
      dflt = inner.doc!.defaultValue;
      optional = true;
    } else if (inner.kind === 'optional') optional = true;
    else break;
    inner = inner.doc!.inner!;
  }
  return { inner, dflt, optional };
}

function walk(s: Schema<unknown>, path: string, rows: ReferenceRow[]): void {
  const { inner, dflt, optional } = unwrap(s);
  if (path !== '') {
    const given = dflt !== undefined ? defaultText(dflt, inner) : optional ? '(none)' : '**required**';
    rows.push({ path, accepts: short(acceptsOf(inner)), default: given, flags: FLAGS[path] ?? '' });
  }
  if (inner.fields) {
    for (const [k, f] of Object.entries(inner.fields))
      walk(f as Schema<unknown>, path === '' ? k : `${path}.${k}`, rows);
    return;
  }
  const item = inner.kind === 'arr' || inner.kind === 'record' ? inner.doc?.inner : undefined;
  if (item && unwrap(item).inner.fields) walk(item, inner.kind === 'arr' ? `${path}[]` : `${path}.<name>`, rows);
}

/** Every field of a scenario (or serving config) file, in file order. */
export function configReference(): ReferenceRow[] {
  const rows: ReferenceRow[] = [];
  walk(scenarioSchema as Schema<unknown>, '', rows);
  return rows;
}

const cell = (text: string): string => text.replace(/\|/g, '\\|').replace(/\n/g, ' ');

/** docs/configuration.md as `npm run docs:config` writes it. */
export function configReferenceMarkdown(): string {
  const rows = configReference();
  const sections = new Map<string, ReferenceRow[]>();
  const nested = new Set(
    rows
      .map((r) => r.path.split(/[.[]/)[0]!)
      .filter((t) => rows.some((r) => r.path.startsWith(`${t}.`) || r.path.startsWith(`${t}[`))),
  );
  for (const r of rows) {
    const first = r.path.split(/[.[]/)[0]!;
    const top = nested.has(first) ? first : 'the file';
    if (!sections.has(top)) sections.set(top, []);
    sections.get(top)!.push(r);
  }
  const out = [
    '# Configuration reference',
    '',
    'One YAML file describes a node: what `switchyard serve --config`, `simulate`, `plan` and `calibrate` read. This',
    'reference is written from the schema that validates the file (`actors/config.ts`, by `npm run docs:config`; a test',
    'fails when it is out of date): every field, what it accepts, its default, and the matching vLLM or SGLang flag',
    'where one exists. A bad file is refused naming the field (`models[0].tp: must divide the query heads …`); rules',
    'across fields (tp against the profile, placement against the node, traffic against the models) are checked after',
    'these. `[]` marks the items of a list, `<name>` the entries of a map whose names you choose.',
    '',
  ];
  for (const [top, list] of sections) {
    out.push(
      top === 'the file' ? '## The file' : `## \`${top}\``,
      '',
      '| field | accepts | default | vLLM / SGLang |',
      '|---|---|---|---|',
    );
    for (const r of list)
      out.push(`| \`${cell(r.path)}\` | ${cell(r.accepts)} | ${cell(r.default)} | ${cell(r.flags)} |`);
    out.push('');
  }
  return out.join('\n');
}
