/**
 * Tokens by their bytes, as a trie in flat arrays: node 0 is the root (the empty prefix), a node's
 * children are `childByte/childNode[childStart[n] .. childStart[n + 1])` in byte order, and the
 * tokens whose bytes end at a node are `tokenIds[tokenStart[n] .. tokenStart[n + 1])` (several
 * ids may spell the same bytes, e.g. a sentencepiece "▁" and its byte token <0x20>).
 */
export class ByteTrie {
  readonly childStart: Int32Array
  readonly childByte: Uint8Array
  readonly childNode: Int32Array
  readonly tokenStart: Int32Array
  readonly tokenIds: Int32Array

  constructor(entries: ReadonlyArray<readonly [bytes: Uint8Array, token: number]>) {
    // In byte order the entries spell the nodes depth first: each entry adds the nodes past the
    // prefix it shares with the one before, and a node's children come in byte order.
    const keyed = entries.map(([bytes, token]) => ({ key: String.fromCharCode(...bytes), bytes, token }))
    keyed.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.token - b.token))
    const parents: Array<number> = [-1]
    const bytesIn: Array<number> = [0]
    const tokenNode = new Int32Array(keyed.length)
    const path = [0]
    let previous: Uint8Array = new Uint8Array(0)
    keyed.forEach(({ bytes }, i) => {
      let shared = 0
      while (shared < bytes.length && shared < previous.length && bytes[shared] === previous[shared]) shared++
      path.length = shared + 1
      for (let depth = shared; depth < bytes.length; depth++) {
        parents.push(path[depth]!)
        bytesIn.push(bytes[depth]!)
        path.push(parents.length - 1)
      }
      tokenNode[i] = path[bytes.length]!
      previous = bytes
    })
    const count = parents.length
    this.childStart = new Int32Array(count + 1)
    for (let node = 1; node < count; node++) this.childStart[parents[node]! + 1]!++
    for (let node = 0; node < count; node++) this.childStart[node + 1]! += this.childStart[node]!
    this.childByte = new Uint8Array(count - 1)
    this.childNode = new Int32Array(count - 1)
    const filled = this.childStart.slice(0, count)
    for (let node = 1; node < count; node++) {
      const edge = filled[parents[node]!]!++
      this.childByte[edge] = bytesIn[node]!
      this.childNode[edge] = node
    }
    // Entries are sorted, so the tokens of a node are consecutive and nodes come in order.
    this.tokenStart = new Int32Array(count + 1)
    this.tokenIds = new Int32Array(keyed.length)
    keyed.forEach(({ token }, i) => {
      this.tokenIds[i] = token
      this.tokenStart[tokenNode[i]! + 1]!++
    })
    for (let node = 0; node < count; node++) this.tokenStart[node + 1]! += this.tokenStart[node]!
  }

  get size(): number {
    return this.childStart.length - 1
  }

  /** The node reached from `node` by `byte`, or -1. */
  child(node: number, byte: number): number {
    for (let edge = this.childStart[node]!; edge < this.childStart[node + 1]!; edge++) {
      if (this.childByte[edge] === byte) return this.childNode[edge]!
    }
    return -1
  }
}
