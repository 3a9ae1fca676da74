import { networkInterfaces } from "node:os"
import { BlockList, isIPv4, isIPv6 } from "node:net"

/**
 * Which IP addresses a media fetch may connect to: only public unicast ones, as IANA's IPv4 and IPv6
 * Special-Purpose Address Registries tell them. Everything else (loopback, private, link-local,
 * shared, benchmarking, documentation, multicast, reserved, this host's own interfaces) is refused.
 * IPv6 is held to an allow-list: only global unicast (2000::/3) is public, less the special blocks
 * in it, so that a block assigned outside it later (as SRv6's 5f00::/16 was) is refused already. An
 * IPv6 form that stands for an IPv4 address (IPv4-mapped, IPv4-translated, NAT64, 6to4, Teredo) is
 * judged by that IPv4 address, since the network may route it there: it is refused when that
 * address is not public, or is one of this host's own.
 */

const nonPublicIpv4 = new BlockList()
for (const [network, prefix] of [
  ["0.0.0.0", 8], // "this network"
  ["10.0.0.0", 8],
  ["100.64.0.0", 10], // carrier-grade NAT
  ["127.0.0.0", 8],
  ["169.254.0.0", 16], // link-local, cloud metadata services
  ["172.16.0.0", 12],
  ["192.0.0.0", 24], // IETF protocol assignments (DS-Lite, NAT64 discovery, PCP and TURN anycast)
  ["192.0.2.0", 24], // documentation
  ["192.31.196.0", 24], // AS112 DNS sinks
  ["192.52.193.0", 24], // AMT relays
  ["192.88.99.0", 24], // 6to4 relay anycast
  ["192.168.0.0", 16],
  ["192.175.48.0", 24], // AS112 direct delegation
  ["198.18.0.0", 15], // benchmarking
  ["198.51.100.0", 24], // documentation
  ["203.0.113.0", 24], // documentation
  ["224.0.0.0", 4], // multicast
  ["240.0.0.0", 4] // reserved, broadcast
] as const) {
  nonPublicIpv4.addSubnet(network, prefix, "ipv4")
}

/** Global unicast: the only IPv6 space that holds public addresses. */
const globalUnicast = new BlockList()
globalUnicast.addSubnet("2000::", 3, "ipv6")

/** Blocks inside global unicast that are not public (those that carry an IPv4 address are judged by it). */
const nonPublicGlobalIpv6 = new BlockList()
for (const [network, prefix] of [
  ["2001::", 23], // IETF protocol assignments: Teredo, benchmarking (2001:2::/48), ORCHID, AMT, AS112, anycasts
  ["2001:db8::", 32], // documentation
  ["2620:4f:8000::", 48], // AS112 direct delegation
  ["3fff::", 20] // documentation
] as const) {
  nonPublicGlobalIpv6.addSubnet(network, prefix, "ipv6")
}

/** The eight 16-bit groups of an IPv6 address (zone id dropped, embedded dotted IPv4 expanded). */
const ipv6Groups = (address: string): ReadonlyArray<number> => {
  let text = address.split("%", 1)[0]!.toLowerCase()
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text)
  if (dotted !== null) {
    const [a, b, c, d] = dotted[1]!.split(".").map(Number) as [number, number, number, number]
    text = `${text.slice(0, dotted.index)}${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`
  }
  const [head, tail] = text.includes("::") ? text.split("::") : [text, undefined]
  const parse = (part: string | undefined) => (part === undefined || part === "" ? [] : part.split(":"))
  const left = parse(head).map((group) => Number.parseInt(group, 16))
  const right = parse(tail).map((group) => Number.parseInt(group, 16))
  const zeros = tail === undefined ? [] : new Array<number>(8 - left.length - right.length).fill(0)
  return [...left, ...zeros, ...right]
}

/** An IPv6 address as this module compares it: its eight groups in hex. */
const canonicalIpv6 = (groups: ReadonlyArray<number>): string => groups.map((group) => group.toString(16)).join(":")

const ipv4Of = (high: number, low: number) => `${high >>> 8}.${high & 0xff}.${low >>> 8}.${low & 0xff}`

/**
 * The IPv4 address an IPv6 address outside global unicast stands for: IPv4-mapped
 * (`::ffff:a.b.c.d`), IPv4-translated (`::ffff:0:a.b.c.d`) and NAT64's well-known prefix
 * (`64:ff9b::a.b.c.d`); `undefined` for any other. (NAT64's local-use prefix, `64:ff9b:1::/48`,
 * is for networks of their own and is refused whole, whatever IPv4 address it carries.)
 */
const translatedIpv4 = (groups: ReadonlyArray<number>): string | undefined => {
  const [g0, g1, g2, g3, g4, g5, g6, g7] = groups as [number, number, number, number, number, number, number, number]
  const middleZeros = g2 === 0 && g3 === 0
  if (g0 === 0 && g1 === 0 && middleZeros && ((g4 === 0 && g5 === 0xffff) || (g4 === 0xffff && g5 === 0))) {
    return ipv4Of(g6, g7)
  }
  if (g0 === 0x64 && g1 === 0xff9b && middleZeros && g4 === 0 && g5 === 0) return ipv4Of(g6, g7)
  return undefined
}

/** The IPv4 addresses a global unicast IPv6 address carries: 6to4's, Teredo's server and client. */
const carriedIpv4 = (groups: ReadonlyArray<number>): ReadonlyArray<string> => {
  const [g0, g1, g2, g3, , , g6, g7] = groups as [number, number, number, number, number, number, number, number]
  if (g0 === 0x2002) return [ipv4Of(g1, g2)]
  if (g0 === 0x2001 && g1 === 0) return [ipv4Of(g2, g3), ipv4Of(g6 ^ 0xffff, g7 ^ 0xffff)]
  return []
}

/** The IPv4 addresses an IPv6 address stands for or carries, which the network may route it to. */
const ipv4sOf = (groups: ReadonlyArray<number>): ReadonlyArray<string> => {
  const translated = translatedIpv4(groups)
  return translated === undefined ? carriedIpv4(groups) : [translated]
}

/** Why an IPv6 address may not be fetched from, or `undefined` when it is public. */
const nonPublicIpv6Reason = (bare: string, groups: ReadonlyArray<number>): string | undefined => {
  const translated = translatedIpv4(groups)
  if (translated !== undefined) {
    return nonPublicIpv4.check(translated, "ipv4")
      ? `${bare} carries the non-public IPv4 address ${translated}`
      : undefined
  }
  const normal = canonicalIpv6(groups)
  if (!globalUnicast.check(normal, "ipv6")) return `${bare} is not a public address`
  const inner = carriedIpv4(groups).find((ipv4) => nonPublicIpv4.check(ipv4, "ipv4"))
  if (inner !== undefined) return `${bare} carries the non-public IPv4 address ${inner}`
  if (nonPublicGlobalIpv6.check(normal, "ipv6")) return `${bare} is not a public address`
  return undefined
}

/** An address as this module compares it: IPv4 dotted, IPv6 as `canonicalIpv6`. */
const canonical = (address: string): string =>
  isIPv6(address.split("%", 1)[0]!) ? canonicalIpv6(ipv6Groups(address)) : address

/** The addresses of this host's own interfaces, loopback included. */
export const interfaceAddresses = (): ReadonlyArray<string> =>
  Object.values(networkInterfaces()).flatMap((entries) => (entries ?? []).map((entry) => entry.address))

/**
 * Why `address` may not be fetched from, or `undefined` when it is a public unicast address.
 * Anything that is not an IP address literal is refused, and so is any of `ownAddresses` (this
 * host's interfaces') in any form: an IPv6 address that stands for or carries one of them
 * (`::ffff:a.b.c.d`, `::ffff:0:a.b.c.d`, `64:ff9b::a.b.c.d`, 6to4, Teredo) leads to this host too.
 */
export const nonPublicReason = (
  address: string,
  ownAddresses: ReadonlyArray<string> = interfaceAddresses()
): string | undefined => {
  const bare = address.replace(/^\[|\]$/g, "")
  let forms: ReadonlyArray<string>
  if (isIPv4(bare)) {
    if (nonPublicIpv4.check(bare, "ipv4")) return `${bare} is not a public address`
    forms = [bare]
  } else if (isIPv6(bare.split("%", 1)[0]!)) {
    const groups = ipv6Groups(bare)
    const reason = nonPublicIpv6Reason(bare, groups)
    if (reason !== undefined) return reason
    forms = [canonicalIpv6(groups), ...ipv4sOf(groups)]
  } else {
    return `${address} is not an IP address`
  }
  const own = new Set(ownAddresses.map(canonical))
  const ours = forms.find((form) => own.has(form))
  if (ours === undefined) return undefined
  return ours === forms[0]
    ? `${bare} is an address of this host`
    : `${bare} stands for ${ours}, an address of this host`
}

export const isPublicAddress = (address: string): boolean => nonPublicReason(address) === undefined
