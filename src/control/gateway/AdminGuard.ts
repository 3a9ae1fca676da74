import { isIP } from "node:net"

/**
 * Who may reach the admin routes (register, unregister, scale) from a browser. Without an admin token
 * any page the operator visits could POST to the platform: a cross-site form (CSRF) or a page on a
 * domain that rebinds its DNS name to 127.0.0.1. So an admin request must name this server in `Host`
 * (an IP literal, `localhost`, the bound host or an allowed name: a rebinding attack always arrives
 * under the attacker's domain name), carry no foreign `Origin`, and be `application/json` (which a
 * cross-site page cannot send without a CORS preflight, and this server answers none).
 */
export interface AdminGuardOptions {
  /** The host the gateway listens on, as given to `--host`. */
  readonly boundHost: string
  /** Further host names operators reach the gateway by (`--allowed-host`). */
  readonly allowedHosts: ReadonlyArray<string>
}

/** The host name of a `Host` header or an origin's authority, lower-cased, without port or IPv6 brackets. */
const hostNameOf = (authority: string): string => {
  const trimmed = authority.trim().toLowerCase()
  if (trimmed.startsWith("[")) return trimmed.slice(1, trimmed.indexOf("]") < 0 ? undefined : trimmed.indexOf("]"))
  const colon = trimmed.lastIndexOf(":")
  return colon < 0 ? trimmed : trimmed.slice(0, colon)
}

const isAllowedHostName = (name: string, options: AdminGuardOptions): boolean =>
  name.length > 0 &&
  (isIP(name) !== 0 ||
    name === "localhost" ||
    name === options.boundHost.toLowerCase() ||
    options.allowedHosts.some((allowed) => allowed.toLowerCase() === name))

/** Why an admin request is refused, or `undefined` to let it through to the token check. */
export const adminRequestRefusal = (
  headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>,
  options: AdminGuardOptions
): string | undefined => {
  const host = headers.host
  if (typeof host !== "string" || !isAllowedHostName(hostNameOf(host), options)) {
    return "the Host header does not name this server; add the name with --allowed-host if it is yours"
  }
  const origin = headers.origin
  if (origin !== undefined) {
    let originHost: string | undefined
    try {
      originHost = typeof origin === "string" ? new URL(origin).hostname : undefined
    } catch {
      originHost = undefined
    }
    if (originHost === undefined || !isAllowedHostName(hostNameOf(originHost), options)) {
      return "admin routes do not answer requests from another origin"
    }
  }
  const contentType = headers["content-type"]
  if (typeof contentType !== "string" || contentType.split(";", 1)[0]!.trim().toLowerCase() !== "application/json") {
    return "admin routes take content-type: application/json"
  }
  return undefined
}
