// Maps a data path back to a line in the YAML source, so every config error can say where to look.
import { isAlias, isMap, isPair, isScalar, isSeq, type Document, type LineCounter, type Node, type Pair, type YAMLMap } from 'yaml';

/**
 * Line of the deepest part of `path` that exists in the file: the key's line for a map entry (where a reader
 * looks), the item's line for a sequence item. A missing key therefore reports its parent's line. A key that a merge
 * (`<<: *defaults`) brings in is found where the anchored mapping writes it.
 */
export function lineOf(doc: Document, lineCounter: LineCounter, path: readonly PropertyKey[]): number | undefined {
  let line = nodeLine(doc.contents, lineCounter);
  walk(doc, path, (node) => (line = nodeLine(node, lineCounter) ?? line));
  return line;
}

/** The node whose value the data holds at `path` (through aliases and merges), or undefined if the file has none. */
export function nodeAt(doc: Document, path: readonly PropertyKey[]): unknown {
  return walk(doc, path, () => {});
}

/** Follows `path` from the document's root, calling `visit` with each key or item on the way; the last node, if reached. */
function walk(doc: Document, path: readonly PropertyKey[], visit: (keyOrItem: unknown) => void): unknown {
  let node: unknown = doc.contents;
  for (const seg of path) {
    if (isAlias(node)) node = node.resolve(doc);
    if (isMap(node)) {
      const pair = pairOf(doc, node, String(seg), new Set());
      if (!pair) return undefined;
      visit(pair.key);
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number') {
      const item = node.items[seg];
      if (item === undefined) return undefined;
      visit(item);
      node = item;
    } else {
      return undefined;
    }
  }
  return isAlias(node) ? node.resolve(doc) : node;
}

/** The entry of `map` for `key`: its own, else the first that a merge key brings in (an own key wins, as in toJS). */
function pairOf(doc: Document, map: YAMLMap, key: string, seen: Set<unknown>): Pair | undefined {
  seen.add(map);
  const own = map.items.find((p) => keyText(p.key) === key);
  if (own) return own;
  for (const pair of map.items) {
    if (!isMergeKey(pair.key)) continue;
    const value = isAlias(pair.value) ? pair.value.resolve(doc) : pair.value;
    for (const item of isSeq(value) ? value.items : [value]) {
      const source = isAlias(item) ? item.resolve(doc) : item;
      const found = isMap(source) && !seen.has(source) ? pairOf(doc, source, key, seen) : undefined;
      if (found) return found;
    }
  }
  return undefined;
}

/** `<<` read as a merge key: the parser gives it a symbol for a value. */
function isMergeKey(key: unknown): boolean {
  return isScalar(key) && typeof key.value === 'symbol';
}

/** Path of the map that holds the key starting at `offset`, and the key; for errors that only carry an offset. */
export function keyAtOffset(doc: Document, offset: number): { path: Array<string | number>; key: string } | undefined {
  const search = (node: unknown, path: Array<string | number>): ReturnType<typeof keyAtOffset> => {
    if (isMap(node)) {
      for (const pair of node.items) {
        const key = keyText(pair.key);
        if (isScalar(pair.key) && pair.key.range?.[0] === offset) return { path, key };
        const found = search(pair.value, [...path, key]);
        if (found) return found;
      }
    } else if (isSeq(node)) {
      for (const [i, item] of node.items.entries()) {
        const found = search(item, [...path, i]);
        if (found) return found;
      }
    }
    return undefined;
  };
  return search(doc.contents, []);
}

/** A key as the data names it; a merge key (a symbol) as written, `<<`. */
function keyText(key: unknown): string {
  if (!isScalar(key)) return String(key);
  return typeof key.value === 'symbol' ? String(key.value.description) : String(key.value);
}

function nodeLine(node: unknown, lineCounter: LineCounter): number | undefined {
  const range = isPair(node) ? undefined : (node as Node | null | undefined)?.range;
  return range ? lineCounter.linePos(range[0]).line : undefined;
}
