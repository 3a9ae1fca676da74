/**
 * Weighted fair queuing between the apps that share a task: each request gets a virtual finish
 * tag, and a queue served in tag order gives each app a share of the executor in proportion to its
 * weight, whatever the others send (self-clocked fair queuing: the virtual time is the tag of the
 * request last taken into service). Requests of one app keep their order; with one app the order is
 * the order of arrival.
 */

/** Whose request it is and its weight (the dispatcher sends both; default: one share). */
export interface Share {
  readonly app: string
  readonly weight: number
}

export const defaultShare: Share = { app: "", weight: 1 }

/** The headers the dispatcher names a call's app and weight in. */
export const shareHeaders = { app: "x-cornserve-app", weight: "x-cornserve-app-weight" } as const

const maxAppChars = 128
const maxWeight = 1000

/** The share a request's headers name; the default for what is missing or malformed. */
export const shareOfHeaders = (
  headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>
): Share => {
  const app = headers[shareHeaders.app]
  const weight = Number(headers[shareHeaders.weight])
  return {
    app: typeof app === "string" && app.length <= maxAppChars ? app : defaultShare.app,
    weight: Number.isFinite(weight) && weight > 0 ? Math.min(weight, maxWeight) : defaultShare.weight
  }
}

export class FairTags {
  private virtualTime = 0
  /** Each app's last finish tag, while it is ahead of the virtual time. */
  private readonly last = new Map<string, number>()

  /** The finish tag of a request of `cost` (its items, say) from `share`. */
  tag(share: Share, cost: number): number {
    const start = Math.max(this.virtualTime, this.last.get(share.app) ?? 0)
    const finish = start + cost / share.weight
    this.last.set(share.app, finish)
    return finish
  }

  /** A request with `tag` was taken into service. */
  served(tag: number): void {
    if (tag <= this.virtualTime) return
    this.virtualTime = tag
    for (const [app, finish] of this.last) if (finish <= this.virtualTime) this.last.delete(app)
  }
}

/** Inserts `entry` after every entry whose tag is not greater: a queue kept in tag order, stable. */
export const insertByTag = <T extends { readonly tag: number }>(queue: Array<T>, entry: T): void => {
  let at = queue.length
  while (at > 0 && queue[at - 1]!.tag > entry.tag) at--
  queue.splice(at, 0, entry)
}
