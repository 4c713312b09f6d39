// The import graph's layering: which folder may import which, and a checker that lists every import pointing the wrong way.
import { join, relative, resolve } from 'node:path';
import ts from 'typescript';

/**
 * The layers from the bottom up. A file may import from its own layer or any layer below it, never above.
 * `machines/` and `runtime/` are both foundations: machines import only xstate (test/machines/purity.test.ts), the
 * runtime (clock, rng, ids, deadlines, actor registry) imports nothing of the project but machine types.
 */
export const LAYERS: readonly (readonly string[])[] = [
  ['machines'],
  ['runtime'],
  ['transport'],
  ['actors'],
  ['inspector'],
  ['api'],
  ['bin', 'deploy'],
  ['bench'],
  ['test'],
];

/** Folders inside a layer that may import only some of their neighbours (the worker must not know the control plane). */
export const WITHIN: readonly { from: string; mayImport: readonly string[] }[] = [
  {
    from: 'actors/worker',
    mayImport: ['actors/worker', 'actors/gpu', 'actors/engine', 'actors/engine-core', 'actors/batcher'],
  },
  { from: 'actors/engine', mayImport: ['actors/engine', 'actors/gpu', 'actors/engine-core', 'actors/batcher'] },
  { from: 'actors/engine-core', mayImport: ['actors/engine-core', 'actors/gpu', 'actors/batcher'] },
  { from: 'actors/batcher', mayImport: ['actors/batcher', 'actors/gpu'] },
  { from: 'actors/gpu', mayImport: ['actors/gpu'] },
];

/** One import that points the wrong way. */
export interface LayerViolation {
  file: string;
  line: number;
  specifier: string;
  reason: string;
}

const rankOf = (top: string): number => LAYERS.findIndex((l) => l.includes(top));

/** The project-relative import specifiers of one source file (static, re-exports, dynamic, type-only alike). */
export function importsOf(source: string, file: string): { specifier: string; line: number }[] {
  const sf = ts.createSourceFile(file, source, ts.ScriptTarget.ES2022, true, ts.ScriptKind.TS);
  const out: { specifier: string; line: number }[] = [];
  const add = (node: ts.Node, text: string): void => {
    out.push({ specifier: text, line: sf.getLineAndCharacterOfPosition(node.getStart()).line + 1 });
  };
  const visit = (node: ts.Node): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier) {
      if (ts.isStringLiteral(node.moduleSpecifier)) add(node, node.moduleSpecifier.text);
    } else if (ts.isCallExpression(node) && node.expression.kind === ts.SyntaxKind.ImportKeyword) {
      const [arg] = node.arguments;
      if (arg && ts.isStringLiteralLike(arg)) add(node, arg.text);
    } else if (ts.isImportTypeNode(node) && ts.isLiteralTypeNode(node.argument)) {
      const lit = node.argument.literal;
      if (ts.isStringLiteral(lit)) add(node, lit.text);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out.filter((i) => i.specifier.startsWith('.'));
}

/** Every wrong-way import among `files` (project-relative path → source), resolved against `root`. */
export function layerViolations(files: ReadonlyMap<string, string>, root: string): LayerViolation[] {
  const out: LayerViolation[] = [];
  for (const [file, source] of files) {
    const fromTop = file.split('/')[0]!;
    const fromRank = rankOf(fromTop);
    if (fromRank < 0) continue;
    for (const { specifier, line } of importsOf(source, file)) {
      const target = relative(root, resolve(join(root, file, '..'), specifier))
        .split(/[\\/]/)
        .join('/');
      const toTop = target.split('/')[0]!;
      const toRank = rankOf(toTop);
      if (toRank > fromRank) {
        out.push({
          file,
          line,
          specifier,
          reason: `${fromTop}/ (layer ${fromRank}) imports ${toTop}/ (layer ${toRank})`,
        });
        continue;
      }
      const rule = WITHIN.find((w) => file.startsWith(`${w.from}/`));
      if (rule && toTop === fromTop && !rule.mayImport.some((p) => target.startsWith(`${p}/`))) {
        out.push({ file, line, specifier, reason: `${rule.from}/ may import only ${rule.mayImport.join(', ')}` });
      }
    }
  }
  return out;
}
