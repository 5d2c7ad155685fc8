// Says where an anchor is misused (`*timeoutz` for `*timeouts`, an alias above its anchor, `<<:` of a scalar): the
// YAML library finds these only when it builds the tree, and its words carry no line ("Merge sources must be maps or
// map aliases"), so a user could not tell which of the file's aliases to fix.
import { isAlias, isCollection, isMap, isPair, isScalar, isSeq, visit, type Document, type LineCounter, type Node } from 'yaml';
import { formatPath, type ConfigIssue } from './errors.ts';
import { closest } from './unknown-key.ts';

/** One issue per alias that names no anchor set before it, and per merge key (`<<`) that brings in no mapping. */
export function anchorIssues(doc: Document, lineCounter: LineCounter): ConfigIssue[] {
  // Anchors in document order, with where they start: an alias sees only those before it.
  const anchors: Array<{ name: string; offset: number }> = [];
  visit(doc, {
    Node(_key, node) {
      if ((isScalar(node) || isCollection(node)) && node.anchor) anchors.push({ name: node.anchor, offset: node.range?.[0] ?? 0 });
    },
  });
  const issues: ConfigIssue[] = [];
  const lineAt = (node: Node) => (node.range ? lineCounter.linePos(node.range[0]).line : undefined);
  visit(doc, {
    Alias(_key, alias, ancestors) {
      if (alias.resolve(doc) !== undefined) return;
      const at = alias.range?.[0] ?? 0;
      const later = anchors.find((a) => a.name === alias.source && a.offset > at);
      const before = [...new Set(anchors.filter((a) => a.offset < at).map((a) => a.name))];
      const guess = closest(alias.source, before);
      const message = later
        ? `alias *${alias.source} comes before its anchor &${alias.source} (line ${lineCounter.linePos(later.offset).line}): move the anchored block above its first use`
        : `alias *${alias.source} names no anchor set above it${guess ? `; did you mean *${guess}?` : before.length > 0 ? ` (anchors above it: ${before.map((a) => `&${a}`).join(', ')})` : ''}`;
      issues.push({ path: formatPath(dataPath(ancestors, alias)), line: lineAt(alias), message });
    },
    Pair(_key, pair, ancestors) {
      // With merge on, the parser gives a `<<` key a symbol as its value: that is what tells a merge from a `"<<"` key.
      if (!isScalar(pair.key) || typeof pair.key.value !== 'symbol') return;
      const sources = isSeq(pair.value) ? pair.value.items : [pair.value];
      for (const source of sources) {
        const target = isAlias(source) ? source.resolve(doc) : source;
        // An unresolved alias has its own issue above; a value is never quoted (it may be a key from the environment).
        if (target === undefined || isMap(target)) continue;
        const what = isAlias(source) ? `*${source.source} is ${isSeq(target) ? 'a list' : 'a single value'}` : 'its value is not a mapping';
        issues.push({ path: formatPath(dataPath(ancestors, pair)), line: lineAt(source as Node), message: `merge key << takes a mapping (or a list of aliases to mappings): ${what}` });
      }
    },
  });
  return issues;
}

/**
 * The alias that made the tree too large to build (the library's "Excessive alias count indicates a resource exhaustion
 * attack", with no line): the first one whose anchor holds aliases itself, as every alias bomb nests them.
 */
export function aliasBombIssue(doc: Document, lineCounter: LineCounter): ConfigIssue | undefined {
  let issue: ConfigIssue | undefined;
  visit(doc, {
    Alias(_key, alias, ancestors) {
      const target = alias.resolve(doc);
      let nests = false;
      if (target && isCollection(target)) visit(target, { Alias: () => ((nests = true), visit.BREAK) });
      if (!nests) return;
      const line = alias.range ? lineCounter.linePos(alias.range[0]).line : undefined;
      issue = { path: formatPath(dataPath(ancestors, alias)), line, message: `alias *${alias.source} expands to more copies of anchored blocks than the gateway reads (an anchor that holds aliases, aliased again: a YAML alias bomb?): write the repeated blocks out, or alias fewer times` };
      return visit.BREAK;
    },
  });
  return issue;
}

/** The data path of a node from visit's ancestors: map keys and list indexes; a merge key's own `<<` left out. */
function dataPath(ancestors: readonly unknown[], node: unknown): Array<string | number> {
  const path: Array<string | number> = [];
  const chain = [...ancestors, node];
  for (let i = 0; i < chain.length - 1; i++) {
    const here = chain[i];
    const next = chain[i + 1];
    if (isSeq(here)) path.push(here.items.indexOf(next as never));
    else if (isPair(here) && next === here.value) {
      const key = isScalar(here.key) ? here.key.value : here.key;
      if (typeof key !== 'symbol') path.push(String(key));
    }
  }
  return path;
}
