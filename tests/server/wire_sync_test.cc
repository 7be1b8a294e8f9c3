// The kimi.internal mirrors must match kimi.v1 field for field (numbers, names, labels; string
// there is bytes here), or requests would be misread.
#include "gtest/gtest.h"
#include "kimi/internal/wire.pb.h"
#include "kimi/v1/generation.pb.h"

namespace kimi::server {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;

void ExpectMirror(const Descriptor* pub, const Descriptor* mirror) {
  ASSERT_EQ(pub->field_count(), mirror->field_count()) << pub->full_name();
  for (int i = 0; i < pub->field_count(); ++i) {
    const FieldDescriptor* a = pub->field(i);
    const FieldDescriptor* b = mirror->FindFieldByNumber(a->number());
    ASSERT_NE(b, nullptr) << a->full_name();
    EXPECT_EQ(a->name(), b->name()) << a->full_name();
    EXPECT_EQ(a->is_repeated(), b->is_repeated()) << a->full_name();
    EXPECT_EQ(a->containing_oneof() != nullptr, b->containing_oneof() != nullptr)
        << a->full_name();
    if (a->type() == FieldDescriptor::TYPE_STRING) {
      EXPECT_EQ(b->type(), FieldDescriptor::TYPE_BYTES) << a->full_name();
    } else if (a->type() == FieldDescriptor::TYPE_MESSAGE) {
      ASSERT_EQ(b->type(), FieldDescriptor::TYPE_MESSAGE) << a->full_name();
      if (a->message_type() != b->message_type()) ExpectMirror(a->message_type(), b->message_type());
    } else {
      EXPECT_EQ(a->type(), b->type()) << a->full_name();
    }
  }
}

TEST(WireSync, InternalMirrorsMatchThePublicMessages) {
  ExpectMirror(v1::GenerateRequest::descriptor(), internal::GenerateRequest::descriptor());
  ExpectMirror(v1::TokenizeRequest::descriptor(), internal::TokenizeRequest::descriptor());
}

// A request written with the public message reads back identically through the mirror.
TEST(WireSync, PublicBytesParseWithTheMirror) {
  v1::GenerateRequest r;
  r.set_request_id("id-1");
  r.mutable_chat()->add_messages()->set_role("user");
  r.mutable_chat()->mutable_messages(0)->set_content("héllo");
  r.set_max_tokens(7);
  r.mutable_sampling()->set_top_p(0.5f);
  r.add_stop("\n\n");
  r.set_priority(-2);
  internal::GenerateRequest m;
  ASSERT_TRUE(m.ParseFromString(r.SerializeAsString()));
  EXPECT_EQ(m.request_id(), "id-1");
  EXPECT_EQ(m.chat().messages(0).content(), "héllo");
  EXPECT_EQ(m.max_tokens(), 7u);
  EXPECT_FLOAT_EQ(m.sampling().top_p(), 0.5f);
  EXPECT_EQ(m.stop(0), "\n\n");
  EXPECT_EQ(m.priority(), -2);
}

}  // namespace
}  // namespace kimi::server
