import { networkInterfaces } from "node:os"
import { BlockList, isIPv4, isIPv6 } from "node:net"

/**
 * Which IP addresses a media fetch may connect to: only public unicast ones. Everything else (loopback,
 * private, link-local, shared, benchmarking, documentation, multicast, reserved, this host's own
 * interfaces) is refused, and so is any IPv6 form that carries such an IPv4 address inside it
 * (IPv4-mapped, IPv4-compatible, NAT64, 6to4, Teredo), since the network may route those to it.
 */

const nonPublicIpv4 = new BlockList()
for (const [network, prefix] of [
  ["0.0.0.0", 8], // "this network"
  ["10.0.0.0", 8],
  ["100.64.0.0", 10], // carrier-grade NAT
  ["127.0.0.0", 8],
  ["169.254.0.0", 16], // link-local, cloud metadata services
  ["172.16.0.0", 12],
  ["192.0.0.0", 24], // IETF protocol assignments
  ["192.0.2.0", 24], // documentation
  ["192.88.99.0", 24], // 6to4 relay anycast
  ["192.168.0.0", 16],
  ["198.18.0.0", 15], // benchmarking
  ["198.51.100.0", 24], // documentation
  ["203.0.113.0", 24], // documentation
  ["224.0.0.0", 4], // multicast
  ["240.0.0.0", 4] // reserved, broadcast
] as const) {
  nonPublicIpv4.addSubnet(network, prefix, "ipv4")
}

const nonPublicIpv6 = new BlockList()
for (const [network, prefix] of [
  ["::", 96], // unspecified, loopback, IPv4-compatible (checked again by their embedded IPv4 below)
  ["100::", 64], // discard
  ["64:ff9b:1::", 48], // local-use NAT64
  ["2001:db8::", 32], // documentation
  ["2001:10::", 28], // ORCHID
  ["2001:20::", 28], // ORCHIDv2
  ["fc00::", 7], // unique local
  ["fe80::", 10], // link-local
  ["fec0::", 10], // site-local (deprecated, still routed by some stacks)
  ["ff00::", 8] // multicast
] as const) {
  nonPublicIpv6.addSubnet(network, prefix, "ipv6")
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

const ipv4Of = (high: number, low: number) => `${high >>> 8}.${high & 0xff}.${low >>> 8}.${low & 0xff}`

/** The IPv4 addresses an IPv6 address stands for, by the transition mechanisms that embed one. */
const embeddedIpv4 = (groups: ReadonlyArray<number>): ReadonlyArray<string> => {
  const [g0, g1, g2, g3, g4, g5, g6, g7] = groups as [number, number, number, number, number, number, number, number]
  const found: Array<string> = []
  const leadingZeros = g0 === 0 && g1 === 0 && g2 === 0 && g3 === 0 && g4 === 0
  if (leadingZeros && (g5 === 0xffff || g5 === 0)) found.push(ipv4Of(g6, g7)) // IPv4-mapped, IPv4-compatible
  if (g0 === 0x64 && g1 === 0xff9b) found.push(ipv4Of(g6, g7)) // NAT64 well-known prefix
  if (g0 === 0x2002) found.push(ipv4Of(g1, g2)) // 6to4
  if (g0 === 0x2001 && g1 === 0) {
    found.push(ipv4Of(g2, g3)) // Teredo server
    found.push(ipv4Of(g6 ^ 0xffff, g7 ^ 0xffff)) // Teredo client, obfuscated
  }
  return found
}

/** The addresses of this host's own interfaces, loopback included. */
const ownAddresses = (): ReadonlySet<string> => {
  const addresses = new Set<string>()
  for (const entries of Object.values(networkInterfaces())) {
    for (const entry of entries ?? []) addresses.add(canonical(entry.address))
  }
  return addresses
}

const canonical = (address: string): string =>
  isIPv6(address.split("%", 1)[0]!)
    ? ipv6Groups(address)
        .map((group) => group.toString(16))
        .join(":")
    : address

/**
 * Why `address` may not be fetched from, or `undefined` when it is a public unicast address. Anything
 * that is not an IP address literal is refused.
 */
export const nonPublicReason = (address: string): string | undefined => {
  const bare = address.replace(/^\[|\]$/g, "")
  if (isIPv4(bare)) {
    if (nonPublicIpv4.check(bare, "ipv4")) return `${bare} is not a public address`
  } else if (isIPv6(bare.split("%", 1)[0]!)) {
    const groups = ipv6Groups(bare)
    if (nonPublicIpv6.check(groups.map((group) => group.toString(16)).join(":"), "ipv6")) {
      return `${bare} is not a public address`
    }
    const inner = embeddedIpv4(groups).find((ipv4) => nonPublicIpv4.check(ipv4, "ipv4"))
    if (inner !== undefined) return `${bare} carries the non-public IPv4 address ${inner}`
  } else {
    return `${address} is not an IP address`
  }
  if (ownAddresses().has(canonical(bare))) return `${bare} is an address of this host`
  return undefined
}

export const isPublicAddress = (address: string): boolean => nonPublicReason(address) === undefined
