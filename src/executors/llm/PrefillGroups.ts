/**
 * Requests that join a batch in one step are prefilled together, each prompt padded to the longest
 * of its run. When their lengths differ widely the padding costs more than another run would (a
 * 20-token prompt beside a 2,000-token one is computed at 2,000 positions), so the prompts, shortest
 * first, are split into runs wherever that is less work. A run is taken to cost `runCost` prompt
 * positions (reading the weights once more) plus its rows times its longest prompt.
 */
export const prefillRunCost = 32

/** Indices into `lengths`, grouped into the runs that cost least, shortest prompts first. */
export const prefillGroups = (
  lengths: ReadonlyArray<number>,
  runCost: number = prefillRunCost
): Array<Array<number>> => {
  const order = lengths.map((_, index) => index).sort((a, b) => lengths[a]! - lengths[b]! || a - b)
  // least[k]: the least cost of the k shortest prompts; start[k]: where the last of their runs begins.
  const least = [0]
  const start = [0]
  for (let end = 1; end <= order.length; end++) {
    const longest = lengths[order[end - 1]!]!
    least.push(Number.POSITIVE_INFINITY)
    start.push(0)
    for (let from = 0; from < end; from++) {
      const cost = least[from]! + runCost + (end - from) * longest
      if (cost < least[end]!) {
        least[end] = cost
        start[end] = from
      }
    }
  }
  const groups: Array<Array<number>> = []
  for (let end = order.length; end > 0; end = start[end]!) groups.unshift(order.slice(start[end]!, end))
  return groups
}
