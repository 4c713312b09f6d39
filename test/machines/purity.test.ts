// Machines stay pure: no Node built-ins, no ws or msgpackr, and nothing but types from actors/ or transport/.
import { readdirSync, readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { join, relative, resolve } from 'node:path';
import ts from 'typescript';
import { describe, expect, it } from 'vitest';

const root = resolve(import.meta.dirname, '../..');
const machinesDir = join(root, 'machines');
const builtins = new Set(builtinModules);

/** One import a machine must not have: where, what, and why. */
interface ImportViolation {
  file: string;
  line: number;
  specifier: string;
  reason: string;
}

// Why a module may not be imported at run time by a machine (null when it may).
function forbidden(specifier: string, file: string): string | null {
  if (specifier.startsWith('node:') || builtins.has(specifier.split('/')[0]!)) return 'a Node built-in';
  if (specifier === 'ws' || specifier.startsWith('ws/')) return 'the WebSocket library';
  if (specifier === 'msgpackr' || specifier.startsWith('msgpackr/')) return 'the msgpack codec';
  if (specifier.startsWith('.')) {
    const target = relative(root, resolve(join(root, file, '..'), specifier)).split(/[\\/]/)[0];
    if (target === 'actors' || target === 'transport' || target === 'runtime') return `runtime code from ${target}/`;
  }
  return null;
}

/** The imports of one source file that break the purity rule; type-only imports are allowed from anywhere but Node. */
function importViolations(source: string, file: string): ImportViolation[] {
  const sf = ts.createSourceFile(file, source, ts.ScriptTarget.ES2022, true, ts.ScriptKind.TS);
  const out: ImportViolation[] = [];
  const check = (node: ts.Node, specifier: string, typeOnly: boolean): void => {
    const reason = forbidden(specifier, file);
    // Types vanish at run time, but a Node built-in has no business in a machine even as a type.
    if (!reason || (typeOnly && reason !== 'a Node built-in')) return;
    out.push({ file, line: sf.getLineAndCharacterOfPosition(node.getStart()).line + 1, specifier, reason });
  };
  const visit = (node: ts.Node): void => {
    if (ts.isImportDeclaration(node) && ts.isStringLiteral(node.moduleSpecifier)) {
      const clause = node.importClause;
      const named = clause?.namedBindings;
      const allTypes =
        !!clause &&
        (clause.isTypeOnly ||
          (!clause.name &&
            !!named &&
            ts.isNamedImports(named) &&
            named.elements.length > 0 &&
            named.elements.every((e) => e.isTypeOnly)));
      check(node, node.moduleSpecifier.text, allTypes);
    } else if (ts.isExportDeclaration(node) && node.moduleSpecifier && ts.isStringLiteral(node.moduleSpecifier)) {
      check(node, node.moduleSpecifier.text, node.isTypeOnly);
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const expr = node.moduleReference.expression;
      if (ts.isStringLiteral(expr)) check(node, expr.text, node.isTypeOnly);
    } else if (ts.isCallExpression(node) && node.arguments.length > 0) {
      const [arg] = node.arguments;
      const dynamic = node.expression.kind === ts.SyntaxKind.ImportKeyword;
      const required = ts.isIdentifier(node.expression) && node.expression.text === 'require';
      if ((dynamic || required) && arg && ts.isStringLiteralLike(arg)) check(node, arg.text, false);
    } else if (
      ts.isImportTypeNode(node) &&
      ts.isLiteralTypeNode(node.argument) &&
      ts.isStringLiteral(node.argument.literal)
    ) {
      check(node, node.argument.literal.text, true);
    }
    ts.forEachChild(node, visit);
  };
  visit(sf);
  return out;
}

const machineFiles = readdirSync(machinesDir).filter((f) => f.endsWith('.ts'));

describe('machines', () => {
  it('are all checked (the folder is not empty)', () => {
    expect(machineFiles.length).toBeGreaterThanOrEqual(6);
  });

  for (const f of machineFiles) {
    it(`${f} imports no Node built-in, ws, msgpackr, or runtime code from actors/ or transport/`, () => {
      expect(importViolations(readFileSync(join(machinesDir, f), 'utf8'), `machines/${f}`)).toEqual([]);
    });
  }
});

describe('the purity check', () => {
  const file = 'machines/bad.machine.ts';
  const flagged = (source: string): string[] => importViolations(source, file).map((v) => v.specifier);

  it('flags Node built-ins with or without the node: prefix, even as types', () => {
    expect(
      flagged(
        `import { readFileSync } from 'node:fs';\nimport path from 'path';\nimport type { Worker } from 'node:worker_threads';`,
      ),
    ).toEqual(['node:fs', 'path', 'node:worker_threads']);
  });

  it('flags ws and msgpackr, static, dynamic or required', () => {
    expect(
      flagged(`import WebSocket from 'ws';\nconst m = await import('msgpackr');\nconst w = require('ws');`),
    ).toEqual(['ws', 'msgpackr', 'ws']);
  });

  it('flags values from actors/ and transport/ but allows their types', () => {
    const source = [
      `import { createRuntime } from '../runtime/system.ts';`,
      `export { encode } from '../transport/codec.ts';`,
      `import { type Msg, createRuntime as again } from '../runtime/system.ts';`,
      `import type { Runtime } from '../runtime/system.ts';`,
      `import { type Clock } from '../runtime/clock.ts';`,
      `export type { NodeMessage } from '../transport/protocol.ts';`,
      `type P = import('../transport/protocol.ts').NodeMessage;`,
      `import { assign, setup } from 'xstate';`,
      `import type { OutEvent } from './messages.ts';`,
    ].join('\n');
    expect(flagged(source)).toEqual(['../runtime/system.ts', '../transport/codec.ts', '../runtime/system.ts']);
  });
});
