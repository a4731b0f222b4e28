//! The DNS server's answers, pure: the announced services turned into records once
//! per change of state ([`Records::build`]), and the answer to one question from
//! them ([`answer`]). No I/O; the server around it is `dns/mod.rs`.
//!
//! Names under the domain (`drover.` by default; docs/master.md, "DNS"):
//!
//! | name | records |
//! | --- | --- |
//! | `NAME.ENV.ROLE.<domain>` | A/AAAA: every announced instance's address |
//! | `_PORT._tcp.NAME.ENV.ROLE.<domain>` | SRV: priority 0, weight 1, the instance's port, target `INSTANCE.NAME.ENV.ROLE.<domain>` |
//! | `INSTANCE.NAME.ENV.ROLE.<domain>` | A/AAAA: that instance's address |
//! | `<domain>` | SOA |
//!
//! A name under the domain that none of these is (and no parent of one, such as
//! `ENV.ROLE.<domain>`, which answers no data) is NXDOMAIN; a name outside it is
//! REFUSED: the server is authoritative for its domain only and resolves nothing
//! else. Names are matched without regard to case (DNS's rule), as Drover's names
//! are. A service whose names cannot be DNS labels (longer than 63 bytes) is left
//! out.

use std::collections::HashMap;
use std::net::IpAddr;

use drover_common::wire::ServiceView;
use hickory_server::proto::op::ResponseCode;
use hickory_server::proto::rr::rdata::{A, AAAA, SOA, SRV};
use hickory_server::proto::rr::{LowerName, Name, RData, Record, RecordType};

/// The domain served and the TTL of every answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zone {
    /// The domain, fully qualified (`drover.`).
    pub domain: Name,
    /// The TTL of every record, and of negative answers (SOA minimum), in seconds.
    pub ttl: u32,
}

impl Zone {
    /// A zone for `domain` (a trailing dot is added when missing); None when
    /// `domain` is not a domain name.
    pub fn new(domain: &str, ttl: u32) -> Option<Zone> {
        let text = if domain.ends_with('.') {
            domain.to_string()
        } else {
            format!("{domain}.")
        };
        let domain = Name::from_ascii(&text).ok()?;
        if domain.is_root() {
            return None;
        }
        Some(Zone {
            domain: domain.to_lowercase(),
            ttl,
        })
    }
}

/// The records of one name.
#[derive(Clone, Debug, Default)]
struct Node {
    a: Vec<Record>,
    aaaa: Vec<Record>,
    srv: Vec<Record>,
    /// The addresses of the SRV records' targets (the additional section).
    extra: Vec<Record>,
}

/// Every name the zone holds at one state, with its records.
#[derive(Clone, Debug)]
pub struct Records {
    zone: Zone,
    apex: LowerName,
    soa: Record,
    names: HashMap<LowerName, Node>,
}

/// A name built from `labels` under `domain`, or None when a label cannot be one.
fn name(labels: &[&str], domain: &Name) -> Option<Name> {
    let mut text = String::new();
    for label in labels {
        if label.is_empty() || label.len() > 63 || label.contains('.') {
            return None;
        }
        text.push_str(label);
        text.push('.');
    }
    Name::from_ascii(&text).ok()?.append_domain(domain).ok()
}

fn address(owner: &Name, ip: IpAddr, ttl: u32) -> Record {
    let rdata = match ip {
        IpAddr::V4(v4) => RData::A(A(v4)),
        IpAddr::V6(v6) => RData::AAAA(AAAA(v6)),
    };
    Record::from_rdata(owner.clone(), ttl, rdata)
}

impl Node {
    fn add_address(&mut self, record: Record) {
        match record.record_type() {
            RecordType::AAAA => self.aaaa.push(record),
            _ => self.a.push(record),
        }
    }
}

impl Records {
    /// The records of `services` (as the master's state holds them at `serial`).
    pub fn build(zone: &Zone, serial: u64, services: &[ServiceView]) -> Records {
        let ttl = zone.ttl;
        let domain = &zone.domain;
        let soa = Record::from_rdata(
            domain.clone(),
            ttl,
            RData::SOA(SOA::new(
                domain.clone(),
                Name::from_ascii("hostmaster")
                    .and_then(|h| h.append_domain(domain))
                    .unwrap_or_else(|_| domain.clone()),
                serial as u32,
                60,
                30,
                3600,
                ttl,
            )),
        );
        let mut names: HashMap<LowerName, Node> = HashMap::new();
        for service in services {
            let (role, env, svc) = (
                service.role.as_str(),
                service.environment.as_str(),
                service.name.as_str(),
            );
            let Some(service_name) = name(&[svc, env, role], domain) else {
                tracing::debug!(
                    role,
                    env,
                    svc,
                    "a service name that is no DNS name is not served"
                );
                continue;
            };
            // The parents are names too (they answer no data, not NXDOMAIN).
            for parent in [name(&[role], domain), name(&[env, role], domain)]
                .into_iter()
                .flatten()
            {
                names.entry(LowerName::new(&parent)).or_default();
            }
            let mut node = Node::default();
            let mut by_port: HashMap<&str, Node> = HashMap::new();
            // An RRset is a set: instances sharing a host give its address once.
            let mut addresses = std::collections::HashSet::new();
            for endpoint in &service.endpoints {
                let Ok(ip) = endpoint.ip.parse::<IpAddr>() else {
                    tracing::debug!(role, env, svc, ip = %endpoint.ip, "an endpoint without an IP address is not served");
                    continue;
                };
                let instance = endpoint.instance.to_string();
                let Some(target) = name(&[&instance, svc, env, role], domain) else {
                    continue;
                };
                if addresses.insert(ip) {
                    node.add_address(address(&service_name, ip, ttl));
                }
                let mut own = Node::default();
                own.add_address(address(&target, ip, ttl));
                names.insert(LowerName::new(&target), own);
                for (port_name, port) in &endpoint.ports {
                    let srv = by_port.entry(port_name.as_str()).or_default();
                    srv.srv.push(Record::from_rdata(
                        Name::root(),
                        ttl,
                        RData::SRV(SRV::new(0, 1, *port, target.clone())),
                    ));
                    srv.extra.push(address(&target, ip, ttl));
                }
            }
            for (port_name, mut srv) in by_port {
                let label = format!("_{port_name}");
                let (Some(owner), Some(tcp)) = (
                    name(&[&label, "_tcp", svc, env, role], domain),
                    name(&["_tcp", svc, env, role], domain),
                ) else {
                    continue;
                };
                for record in &mut srv.srv {
                    record.name = owner.clone();
                }
                names.entry(LowerName::new(&tcp)).or_default();
                names.insert(LowerName::new(&owner), srv);
            }
            names.insert(LowerName::new(&service_name), node);
        }
        Records {
            zone: zone.clone(),
            apex: LowerName::new(domain),
            soa,
            names,
        }
    }

    /// The zone these records are of.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }
}

/// The answer to one question.
#[derive(Debug)]
pub struct Answer<'r> {
    pub code: ResponseCode,
    /// Whether this server is the authority for the name (everything in its domain).
    pub authoritative: bool,
    pub answers: Vec<&'r Record>,
    /// The SOA, for negative answers (NXDOMAIN, no data).
    pub soa: Option<&'r Record>,
    pub additionals: Vec<&'r Record>,
}

impl<'r> Answer<'r> {
    fn code(code: ResponseCode, authoritative: bool) -> Answer<'r> {
        Answer {
            code,
            authoritative,
            answers: Vec::new(),
            soa: None,
            additionals: Vec::new(),
        }
    }
}

/// `records` starting at `rotate` (modulo their count) and wrapping around: each
/// answer starts at another instance, so clients that take the first spread out.
fn rotated(records: &[Record], rotate: usize) -> impl Iterator<Item = &Record> {
    let k = if records.is_empty() {
        0
    } else {
        rotate % records.len()
    };
    records[k..].iter().chain(records[..k].iter())
}

/// The answer to the question (`qname`, `qtype`) from `records`; `rotate` picks
/// the record answers start at.
pub fn answer<'r>(
    records: &'r Records,
    qname: &LowerName,
    qtype: RecordType,
    rotate: usize,
) -> Answer<'r> {
    if !records.apex.zone_of(qname) {
        return Answer::code(ResponseCode::Refused, false);
    }
    let mut out = Answer::code(ResponseCode::NoError, true);
    if *qname == records.apex {
        if matches!(qtype, RecordType::SOA | RecordType::ANY) {
            out.answers.push(&records.soa);
        } else {
            out.soa = Some(&records.soa);
        }
        return out;
    }
    let Some(node) = records.names.get(qname) else {
        out.code = ResponseCode::NXDomain;
        out.soa = Some(&records.soa);
        return out;
    };
    match qtype {
        RecordType::A => out.answers.extend(rotated(&node.a, rotate)),
        RecordType::AAAA => out.answers.extend(rotated(&node.aaaa, rotate)),
        RecordType::SRV => {
            out.answers.extend(rotated(&node.srv, rotate));
            out.additionals.extend(rotated(&node.extra, rotate));
        }
        RecordType::ANY => {
            out.answers.extend(rotated(&node.a, rotate));
            out.answers.extend(rotated(&node.aaaa, rotate));
            out.answers.extend(rotated(&node.srv, rotate));
        }
        _ => {}
    }
    if out.answers.is_empty() {
        out.soa = Some(&records.soa);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::str::FromStr;

    use drover_common::wire::ServiceEndpoint;

    use super::*;

    fn endpoint(instance: u32, ip: &str, http: u16, admin: Option<u16>) -> ServiceEndpoint {
        let mut ports = BTreeMap::from([("http".to_string(), http)]);
        if let Some(p) = admin {
            ports.insert("admin".to_string(), p);
        }
        ServiceEndpoint {
            instance,
            host: format!("host{instance}"),
            ip: ip.to_string(),
            ports,
            task_id: format!("web-{instance}-000000000000"),
            since: 0,
        }
    }

    fn service(role: &str, env: &str, name: &str, endpoints: Vec<ServiceEndpoint>) -> ServiceView {
        ServiceView {
            role: role.into(),
            environment: env.into(),
            name: name.into(),
            job: name.into(),
            primary_port: "http".into(),
            index: 7,
            endpoints,
        }
    }

    fn records() -> Records {
        let zone = Zone::new("drover", 2).unwrap();
        Records::build(
            &zone,
            7,
            &[
                service(
                    "www-data",
                    "prod",
                    "Web",
                    vec![
                        endpoint(0, "10.0.0.1", 31000, Some(31001)),
                        endpoint(1, "10.0.0.2", 31002, None),
                        endpoint(2, "fd00::3", 31004, None),
                        endpoint(3, "10.0.0.2", 31006, None),
                    ],
                ),
                service("www-data", "prod", "idle", vec![]),
                service(
                    "batch",
                    "devel",
                    &"x".repeat(64),
                    vec![endpoint(0, "10.0.0.9", 1, None)],
                ),
            ],
        )
    }

    fn ask<'r>(records: &'r Records, name: &str, qtype: RecordType) -> Answer<'r> {
        answer(records, &LowerName::from_str(name).unwrap(), qtype, 0)
    }

    fn rdatas(records: &[&Record]) -> Vec<String> {
        let mut v: Vec<String> = records.iter().map(|r| r.data.to_string()).collect();
        v.sort();
        v
    }

    #[test]
    fn a_service_answers_its_instances_addresses_with_the_ttl() {
        let r = records();
        let a = ask(&r, "web.prod.www-data.drover.", RecordType::A);
        assert_eq!(a.code, ResponseCode::NoError);
        assert!(a.authoritative);
        // Instances 1 and 3 share a host: its address once.
        assert_eq!(rdatas(&a.answers), ["10.0.0.1", "10.0.0.2"]);
        assert!(a.answers.iter().all(|r| r.ttl == 2));
        let aaaa = ask(&r, "WEB.Prod.www-data.Drover.", RecordType::AAAA);
        assert_eq!(rdatas(&aaaa.answers), ["fd00::3"]);
    }

    #[test]
    fn srv_names_each_instance_and_its_port_with_the_targets_addresses() {
        let r = records();
        let a = ask(&r, "_http._tcp.web.prod.www-data.drover.", RecordType::SRV);
        assert_eq!(a.code, ResponseCode::NoError);
        assert_eq!(
            rdatas(&a.answers),
            [
                "0 1 31000 0.Web.prod.www-data.drover.",
                "0 1 31002 1.Web.prod.www-data.drover.",
                "0 1 31004 2.Web.prod.www-data.drover.",
                "0 1 31006 3.Web.prod.www-data.drover.",
            ]
        );
        assert_eq!(
            rdatas(&a.additionals),
            ["10.0.0.1", "10.0.0.2", "10.0.0.2", "fd00::3"]
        );
        let admin = ask(&r, "_admin._tcp.web.prod.www-data.drover.", RecordType::SRV);
        assert_eq!(
            rdatas(&admin.answers),
            ["0 1 31001 0.Web.prod.www-data.drover."]
        );
        // The SRV target answers A.
        let target = ask(&r, "1.web.prod.www-data.drover.", RecordType::A);
        assert_eq!(rdatas(&target.answers), ["10.0.0.2"]);
    }

    #[test]
    fn unknown_names_in_the_domain_are_nxdomain_with_the_soa() {
        let r = records();
        for name in [
            "api.prod.www-data.drover.",
            "web.test.www-data.drover.",
            "nobody.drover.",
            "_grpc._tcp.web.prod.www-data.drover.",
            "_http._udp.web.prod.www-data.drover.",
            "4.web.prod.www-data.drover.",
            "x.0.web.prod.www-data.drover.",
        ] {
            let a = ask(&r, name, RecordType::A);
            assert_eq!(a.code, ResponseCode::NXDomain, "{name}");
            assert!(a.answers.is_empty());
            let soa = a.soa.expect("negative answers carry the SOA");
            assert_eq!(soa.ttl, 2);
            let RData::SOA(s) = &soa.data else {
                panic!("{soa:?}")
            };
            assert_eq!(s.minimum, 2, "negative caching lasts the TTL");
        }
    }

    #[test]
    fn existing_names_without_the_type_and_parents_answer_no_data() {
        let r = records();
        for (name, qtype) in [
            ("web.prod.www-data.drover.", RecordType::SRV),
            ("web.prod.www-data.drover.", RecordType::MX),
            ("idle.prod.www-data.drover.", RecordType::A),
            ("prod.www-data.drover.", RecordType::A),
            ("www-data.drover.", RecordType::A),
            ("_tcp.web.prod.www-data.drover.", RecordType::SRV),
            ("drover.", RecordType::A),
        ] {
            let a = ask(&r, name, qtype);
            assert_eq!(a.code, ResponseCode::NoError, "{name} {qtype}");
            assert!(a.answers.is_empty(), "{name} {qtype}");
            assert!(a.soa.is_some(), "{name} {qtype}");
        }
        let soa = ask(&r, "drover.", RecordType::SOA);
        assert_eq!(soa.answers.len(), 1);
        assert_eq!(soa.answers[0].record_type(), RecordType::SOA);
    }

    #[test]
    fn names_outside_the_domain_are_refused() {
        let r = records();
        for name in ["example.com.", "drover.example.", "."] {
            let a = ask(&r, name, RecordType::A);
            assert_eq!(a.code, ResponseCode::Refused, "{name}");
            assert!(!a.authoritative);
            assert!(a.answers.is_empty() && a.soa.is_none());
        }
    }

    #[test]
    fn a_name_that_cannot_be_a_label_is_left_out() {
        let r = records();
        let long = format!("{}.devel.batch.drover.", "x".repeat(64));
        assert!(
            LowerName::from_str(&long).is_err() || {
                let a = ask(&r, &long, RecordType::A);
                a.answers.is_empty()
            }
        );
        assert_eq!(
            ask(&r, "devel.batch.drover.", RecordType::A).code,
            ResponseCode::NXDomain
        );
    }

    #[test]
    fn answers_rotate() {
        let r = records();
        let q = LowerName::from_str("web.prod.www-data.drover.").unwrap();
        let first = |k| answer(&r, &q, RecordType::A, k).answers[0].data.to_string();
        assert_ne!(first(0), first(1));
        assert_eq!(first(0), first(2));
        assert_eq!(answer(&r, &q, RecordType::A, 1).answers.len(), 2);
    }

    #[test]
    fn zones_are_checked() {
        assert_eq!(
            Zone::new("Svc.Example", 5).unwrap().domain.to_string(),
            "svc.example."
        );
        assert!(Zone::new(".", 5).is_none());
        assert!(Zone::new("a..b", 5).is_none());
    }
}
