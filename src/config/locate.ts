// Maps a data path back to a line in the YAML source, so every config error can say where to look.
import { isAlias, isMap, isPair, isScalar, isSeq, type Document, type LineCounter, type Node } from 'yaml';

/**
 * Line of the deepest part of `path` that exists in the file: the key's line for a map entry (where a reader
 * looks), the item's line for a sequence item. A missing key therefore reports its parent's line.
 */
export function lineOf(doc: Document, lineCounter: LineCounter, path: readonly PropertyKey[]): number | undefined {
  let node: unknown = doc.contents;
  let line = nodeLine(node, lineCounter);
  for (const seg of path) {
    if (isAlias(node)) node = node.resolve(doc);
    if (isMap(node)) {
      const pair = node.items.find((p) => keyText(p.key) === String(seg));
      if (!pair) break;
      line = nodeLine(pair.key, lineCounter) ?? line;
      node = pair.value;
    } else if (isSeq(node) && typeof seg === 'number') {
      const item = node.items[seg];
      if (item === undefined) break;
      line = nodeLine(item, lineCounter) ?? line;
      node = item;
    } else {
      break;
    }
  }
  return line;
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

function keyText(key: unknown): string {
  return isScalar(key) ? String(key.value) : String(key);
}

function nodeLine(node: unknown, lineCounter: LineCounter): number | undefined {
  const range = isPair(node) ? undefined : (node as Node | null | undefined)?.range;
  return range ? lineCounter.linePos(range[0]).line : undefined;
}
